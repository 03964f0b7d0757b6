"""``PrometheusMetrics``: headway's hooks as ``prometheus_client`` counters and histograms."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

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

__all__ = ["PrometheusMetrics"]


class PrometheusMetrics:
    """Counters and histograms on a ``prometheus_client`` registry (``headway[prometheus]``).

    Give its methods to the hooks: ``on_decision`` to the rate-limit middleware and
    decorator, ``on_lock`` to ``Lock(on_event=...)``, ``on_idempotency`` to an
    idempotency ``on_event``. One object per registry: registering the metrics twice
    on one registry is refused by ``prometheus_client``.

    Args:
        registry: Where the metrics are registered; default None: ``prometheus_client``'s
            global ``REGISTRY``.

    Raises:
        ValueError: The registry holds headway's metrics already (``prometheus_client``'s
            duplicate error).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = REGISTRY if registry is None else registry
        self._metrics: dict[str, Any] = {i.name: self._create(i) for i in INSTRUMENTS}

    def _create(self, instrument: Instrument) -> Counter | Histogram:
        if instrument.kind == "counter":
            return Counter(
                instrument.name, instrument.description, instrument.labels, registry=self.registry
            )
        return Histogram(
            instrument.name,
            instrument.description,
            instrument.labels,
            registry=self.registry,
            unit=instrument.unit,
            buckets=SECONDS_BUCKETS,
        )

    def _record(self, measures: list[Measure]) -> None:
        for instrument, labels, amount in measures:
            metric = self._metrics[instrument.name].labels(*labels)
            if instrument.kind == "counter":
                metric.inc(amount)
            else:
                metric.observe(amount)

    def on_decision(self, event: RateLimitEvent) -> None:
        """A ``DecisionHook``: count the decision, a refusal, a backend error.

        Args:
            event: The decision, as the middleware, decorator or dependency reports it.
        """
        self._record(measures_of_decision(event))

    def on_lock(self, event: LockEvent) -> None:
        """A ``LockHook``: observe the wait or the hold time; count a backend error.

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
