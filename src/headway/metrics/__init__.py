"""Metrics for the ``headway[prometheus]`` and ``headway[otel]`` extras.

``names`` holds what both exporters share (metric names, labels, how an event maps to
them); ``prometheus`` and ``otel`` import their library, so they are loaded only when
``headway.PrometheusMetrics`` or ``headway.OpenTelemetryMetrics`` is first used.
"""
