"""``import headway`` loads no metrics library: the exporters load on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys, headway
assert 'prometheus_client' not in sys.modules, 'prometheus_client imported'
assert 'headway.metrics.otel' not in sys.modules, 'the OpenTelemetry exporter imported'
headway.PrometheusMetrics
assert 'prometheus_client' in sys.modules
"""


def test_import_headway_loads_no_metrics_library() -> None:
    # A fresh interpreter: this one has imported both already.
    result = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr


def test_an_unknown_attribute_still_raises() -> None:
    import headway

    with pytest.raises(AttributeError, match="NoSuchThing"):
        headway.NoSuchThing  # noqa: B018
