"""Both exporters behind one reader: the real prometheus_client registry (a fresh
``CollectorRegistry``) and the OpenTelemetry SDK's ``InMemoryMetricReader``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from headway import OpenTelemetryMetrics, PrometheusMetrics


class Exported(Protocol):
    """The hooks of one exporter and what its library has recorded."""

    @property
    def metrics(self) -> PrometheusMetrics | OpenTelemetryMetrics:
        """The exporter under test."""
        ...

    def count(self, name: str, **labels: str) -> float:
        """A counter's value, or a histogram's number of observations (0 if none)."""
        ...

    def total(self, name: str, **labels: str) -> float:
        """A histogram's sum of observations."""
        ...

    def label_names(self) -> set[str]:
        """Every label used by any recorded series."""
        ...


class FromPrometheus:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = PrometheusMetrics(self.registry)

    def _sample(self, name: str, labels: dict[str, str]) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def count(self, name: str, **labels: str) -> float:
        if name in ("headway_lock_wait", "headway_lock_hold"):
            return self._sample(f"{name}_seconds_count", labels)
        return self._sample(f"{name}_total", labels)

    def total(self, name: str, **labels: str) -> float:
        return self._sample(f"{name}_seconds_sum", labels)

    def label_names(self) -> set[str]:
        return {
            label
            for family in self.registry.collect()
            for sample in family.samples
            for label in sample.labels
            if label != "le"
        }


class FromOpenTelemetry:
    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.metrics = OpenTelemetryMetrics(self.provider)

    def _points(self, name: str, labels: dict[str, str]) -> list[Any]:
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found += [p for p in metric.data.data_points if p.attributes == labels]
        return found

    def count(self, name: str, **labels: str) -> float:
        points = self._points(name, labels)
        # A histogram's point has a count, a counter's a value.
        return float(sum(p.count if hasattr(p, "count") else p.value for p in points))

    def total(self, name: str, **labels: str) -> float:
        return float(sum(p.sum for p in self._points(name, labels)))

    def label_names(self) -> set[str]:
        data = self.reader.get_metrics_data()
        return {
            key
            for resource in (data.resource_metrics if data else [])
            for scope in resource.scope_metrics
            for metric in scope.metrics
            for point in metric.data.data_points
            for key in point.attributes or {}
        }


@pytest.fixture(params=["prometheus", "otel"])
def exported(request: pytest.FixtureRequest) -> Iterator[Exported]:
    if request.param == "prometheus":
        yield FromPrometheus()
    else:
        otel = FromOpenTelemetry()
        yield otel
        otel.provider.shutdown()
