"""``OpenTelemetryMetrics``: headway's hooks as OpenTelemetry counters and histograms."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from opentelemetry import metrics

from headway.idempotency.events import IdempotencyEvent
from headway.lock.events import LockEvent
from headway.metrics.names import (
    INSTRUMENTS,
    SECONDS_BUCKETS,
    Instrument,
    Measure,
    measures_of_decision,
    measures_of_idempotency,
    measures_of_lock,
)
from headway.ratelimit.http.reporting import RateLimitEvent

__all__ = ["OpenTelemetryMetrics"]


class OpenTelemetryMetrics:
    """Counters and histograms on an OpenTelemetry meter (``headway[otel]``).

    Give its methods to the hooks, as with ``PrometheusMetrics``. Histograms are in
    seconds; names are the Prometheus names (the exporters add their own suffixes).

    Args:
        meter_provider: Where the meter comes from; default None: the global one (set
            up by the application's SDK).
    """

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        meter = metrics.get_meter("headway", version("headway"), meter_provider)
        self._instruments: dict[str, Any] = {i.name: _create(meter, i) for i in INSTRUMENTS}

    def _record(self, measures: list[Measure]) -> None:
        for instrument, labels, amount in measures:
            attributes = dict(zip(instrument.labels, labels, strict=True))
            if instrument.kind == "counter":
                self._instruments[instrument.name].add(amount, attributes)
            else:
                self._instruments[instrument.name].record(amount, attributes)

    def on_decision(self, event: RateLimitEvent) -> None:
        """A ``DecisionHook``: count the decision, a refusal, a backend error.

        Args:
            event: The decision, as the middleware, decorator or dependency reports it.
        """
        self._record(measures_of_decision(event))

    def on_lock(self, event: LockEvent) -> None:
        """A ``LockHook``: record the wait or the hold time; count a backend error.

        Args:
            event: The lock operation, as ``Lock(on_event=...)`` reports it.
        """
        self._record(measures_of_lock(event))

    def on_idempotency(self, event: IdempotencyEvent) -> None:
        """An ``IdempotencyHook``: count the outcome.

        Args:
            event: The outcome, as the middleware or an idempotent function reports it.
        """
        self._record(measures_of_idempotency(event))


def _create(meter: metrics.Meter, instrument: Instrument) -> Any:
    if instrument.kind == "counter":
        return meter.create_counter(instrument.name, "1", instrument.description)
    # The bucket advice (API >= 1.23) keeps waits and holds readable below a second.
    return meter.create_histogram(
        instrument.name,
        "s",
        instrument.description,
        explicit_bucket_boundaries_advisory=list(SECONDS_BUCKETS),
    )
