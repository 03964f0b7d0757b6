"""What the Prometheus and OpenTelemetry exporters share: metric names, labels, and how
each hook's event maps to them (pure functions, no metrics library imported).

Labels are low-cardinality by construction: rule names, outcomes and backend kinds
come from the application's configuration; identities, keys, routes and lock
resources never become labels (they are unbounded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from headway.idempotency.events import IdempotencyEvent
from headway.lock.events import LockEvent
from headway.ratelimit.http.reporting import RateLimitEvent

__all__ = [
    "BACKEND_ERRORS",
    "DECISIONS",
    "IDEMPOTENCY",
    "INSTRUMENTS",
    "LOCK_HOLD",
    "LOCK_WAIT",
    "REFUSALS",
    "SECONDS_BUCKETS",
    "Instrument",
    "Labels",
    "Measure",
    "measures_of_decision",
    "measures_of_idempotency",
    "measures_of_lock",
]

#: Label values in the order of the instrument's ``labels``.
Labels = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Instrument:
    """One metric: ``name`` (without a unit suffix or ``_total``), its kind and labels."""

    name: str
    kind: Literal["counter", "histogram"]
    labels: tuple[str, ...]
    description: str
    unit: str = ""


DECISIONS = Instrument(
    "headway_ratelimit_decisions", "counter", ("rule", "outcome", "shadow"),
    "Rate-limit decisions by rule and outcome (allowed, rejected, errored).",
)  # fmt: skip
REFUSALS = Instrument(
    "headway_ratelimit_refusals", "counter", ("rule", "status"),
    "Requests refused by a rate-limit rule (429, or 503 when a rule fails closed).",
)  # fmt: skip
LOCK_WAIT = Instrument(
    "headway_lock_wait", "histogram", ("backend", "outcome"),
    "How long Lock.acquire waited, by outcome (acquired, not_acquired, errored).", "seconds",
)  # fmt: skip
LOCK_HOLD = Instrument(
    "headway_lock_hold", "histogram", ("backend", "outcome"),
    "How long a lease was held until its release (released, or lost if it had lapsed).",
    "seconds",
)  # fmt: skip
IDEMPOTENCY = Instrument(
    "headway_idempotency_events", "counter", ("kind", "source"),
    "Idempotency outcomes (claimed, replayed, completed, released, conflict, key_reused).",
)  # fmt: skip
BACKEND_ERRORS = Instrument(
    "headway_backend_errors", "counter", ("component", "backend"),
    "Backend failures: Redis, the database, a consensus store did not answer in time.",
)  # fmt: skip

INSTRUMENTS = (DECISIONS, REFUSALS, LOCK_WAIT, LOCK_HOLD, IDEMPOTENCY, BACKEND_ERRORS)

#: Histogram buckets for waits and holds: 1 ms to a minute.
SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

#: One observation: the instrument, its label values, the amount (1 for a counter).
Measure = tuple[Instrument, Labels, float]


def measures_of_decision(event: RateLimitEvent) -> list[Measure]:
    """A rate-limit decision: its count, a refusal if enforced, an error if the backend failed.

    A rate-limit error is labelled ``backend="ratelimit:<rule>"``: the event does not
    name the backend, the rule (from configuration) says which one failed.
    """
    shadow = "true" if event.shadow else "false"
    out: list[Measure] = [(DECISIONS, (event.rule, event.outcome, shadow), 1)]
    if event.outcome == "errored":
        out.append((BACKEND_ERRORS, ("ratelimit", f"ratelimit:{event.rule}"), 1))
    if not event.decision.allowed and not event.shadow:
        status = "503" if event.outcome == "errored" else "429"
        out.append((REFUSALS, (event.rule, status), 1))
    return out


def measures_of_lock(event: LockEvent) -> list[Measure]:
    """A lock operation: the wait or the hold time, and an error if the backend failed."""
    out: list[Measure] = []
    if event.waited is not None:
        out.append((LOCK_WAIT, (event.backend, event.kind), event.waited))
    if event.held is not None:
        out.append((LOCK_HOLD, (event.backend, event.kind), event.held))
    if event.kind == "errored":
        out.append((BACKEND_ERRORS, ("lock", event.backend), 1))
    return out


def measures_of_idempotency(event: IdempotencyEvent) -> list[Measure]:
    """An idempotency outcome (never its key or caller: both are unbounded)."""
    return [(IDEMPOTENCY, (event.kind, event.source), 1)]
