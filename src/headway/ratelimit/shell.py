"""What ``RateLimiter`` and ``SyncRateLimiter`` share: ``Shell``, and two helpers.

Both limiters are thin shells over the same pure parts (``arguments``, ``blocked``,
``decision``); they differ only in how they call the backend and how they sleep
(``limiter.py``, async; ``sync_limiter.py``, blocking).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from headway._clock import Clock, MonotonicClock
from headway.ratelimit.arguments import check_cost, check_policies, check_seconds
from headway.ratelimit.blocked import BlockedCache
from headway.ratelimit.decision import Decision, fallback
from headway.ratelimit.policies import Policy
from headway.ratelimit.reservation import (
    Reservation,
    expiry,
    metered_mask,
    reserved_costs,
    settled_costs,
)

__all__ = ["Shell", "nanoseconds", "retry_pause"]


def nanoseconds(clock: Clock) -> Callable[[], int]:
    """``clock`` in integer nanoseconds: ``time.monotonic_ns`` itself for the default clock.

    A leased decision reads the clock once; the C function saves a Python frame (and
    the float arithmetic) on the hot path.
    """
    if type(clock) is MonotonicClock:
        return time.monotonic_ns
    return lambda: round(clock() * 1e9)


def retry_pause(decision: Decision, deadline: float, now: float) -> float | None:
    """How long ``wait`` sleeps before trying again, or None to return ``decision``."""
    if decision.allowed or decision.failed or decision.retry_after > deadline - now:
        return None
    # A little jitter so that clients blocked together do not all retry together.
    return decision.retry_after + random.uniform(0, min(0.05, decision.retry_after * 0.1))


class Shell:
    """What both limiters share: the checked options, the blocked-key cache, the failure mode."""

    backend: object

    def __init__(
        self,
        policies: Sequence[Policy],
        budget: float,
        retry_on_error: float,
        cache_blocked: bool | int,
        clock: Clock | None,
        metered: Sequence[Policy] | None = None,
    ) -> None:
        self.policies = check_policies(policies)
        self.metered = metered_mask(self.policies, metered)
        self.budget = check_seconds("budget", budget)
        self.retry_on_error = check_seconds("retry_on_error", retry_on_error)
        self.clock: Clock = clock or MonotonicClock()
        self.cache: BlockedCache | None = None
        if cache_blocked:
            size = 10_000 if cache_blocked is True else int(cache_blocked)
            self.cache = BlockedCache(self.clock, size)

    def _cached(self, key: str, cost: int) -> Decision | None:
        self._check(key, cost)
        return None if self.cache is None else self.cache.get(key, cost)

    def _check(self, key: str, cost: int) -> None:
        if type(key) is not str and not isinstance(key, str):
            raise TypeError(f"key must be a str, not {type(key).__name__}")
        check_cost(cost, self.policies)

    def _reserving(self, key: str, estimate: int, ttl: float) -> tuple[tuple[int, ...], float]:
        """The costs of a reservation and when it expires, checked (``reserve``'s errors)."""
        if not (callable(getattr(self.backend, "reserve", None))
                and callable(getattr(self.backend, "settle", None))):  # fmt: skip
            raise TypeError(f"backend {self.backend!r} cannot reserve and settle")
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, not {type(key).__name__}")
        costs = reserved_costs(self.policies, self.metered, estimate)
        return costs, expiry(self.clock(), ttl)

    def _reservation(
        self, key: str, decision: Decision, costs: tuple[int, ...], estimate: int,
        at_us: int | None, expires: float,
    ) -> Reservation:  # fmt: skip
        # Charged only when the backend admitted it (not a failure mode's answer).
        charged = costs if decision.allowed and at_us is not None else (0,) * len(costs)
        return Reservation(self, key, decision, charged, estimate, at_us, expires)

    def _settling(self, reservation: Reservation, actual: int) -> tuple[int, ...] | None:
        """The settled costs to send, or None when there is nothing to send (checked)."""
        if not isinstance(reservation, Reservation):
            raise TypeError(f"not a Reservation: {reservation!r}")
        costs = settled_costs(reservation.charged, self.metered, actual)
        if not reservation.claim(self) or self.clock() > reservation.expires:
            return None  # nothing charged, or expired: the estimate stays
        return costs

    def _failed(self) -> Decision:
        return fallback(self.policies, self.retry_on_error)

    def _remember(self, key: str, cost: int, decision: Decision, sent: float) -> Decision:
        if self.cache is not None:
            self.cache.put(key, cost, decision, sent)
        return decision

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.policies))})"
