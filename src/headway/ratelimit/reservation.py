"""Metered costs: a ``Reservation`` and the pure checks both limiters' ``reserve`` and
``settle`` share.

A reservation charges each policy its own cost at once: a *metered* policy (tokens per
minute) the estimate, every other policy (requests per minute) 1. Settling it with the
actual cost changes the metered policies by ``actual - estimate`` units, each by its
algorithm's rule (``settle_model``); the request policies keep their 1. A reservation
never settled keeps its estimate: there is nothing to do when it expires.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from headway.ratelimit.algorithms import POLICY_CLASSES
from headway.ratelimit.decision import Decision
from headway.ratelimit.policies import MAX_UNITS, Policy

__all__ = ["Reservation", "expiry", "metered_mask", "reserved_costs", "settled_costs"]


class Reservation:
    """An estimate charged by ``reserve``, to be settled once with the actual cost.

    A reservation is true when its decision allowed the work. Limiters make them
    (``RateLimiter.reserve``); the arguments are its attributes. ``settled`` says
    whether ``settle`` was called, ``settled_at_us`` when the backend applied it (its
    clock, integer microseconds; None until then, and when no call was needed).

    Args:
        owner: The limiter that made it (only that one settles it).
        key: Whose quota it charged.
        decision: The limiter's decision on the estimate (what a ``hit`` returns).
        charged: Units charged to each of the limiter's policies, in order: the estimate
            for a metered policy, 1 for the others; all 0 when nothing was charged
            (refused, or a failure mode answered).
        estimate: The estimate the metered policies were asked for.
        at_us: When the backend decided it (its clock, integer microseconds), or None
            when a failure mode answered.
        expires: The limiter clock's time after which ``settle`` does nothing (the
            estimate stays charged).
    """

    __slots__ = (
        "_owner", "at_us", "charged", "decision", "estimate", "expires", "key", "settled",
        "settled_at_us",
    )  # fmt: skip

    def __init__(
        self,
        owner: object,
        key: str,
        decision: Decision,
        charged: tuple[int, ...],
        estimate: int,
        at_us: int | None,
        expires: float,
    ) -> None:
        self._owner = owner
        self.key = key
        self.decision = decision
        self.charged = charged
        self.estimate = estimate
        self.at_us = at_us
        self.expires = expires
        self.settled = False
        self.settled_at_us: int | None = None

    @property
    def allowed(self) -> bool:
        """Whether the work may proceed (the decision allowed it)."""
        return self.decision.allowed

    def __bool__(self) -> bool:
        return self.decision.allowed

    def __repr__(self) -> str:
        state = "settled" if self.settled else "open"
        return (
            f"Reservation(key={self.key!r}, allowed={self.allowed}, "
            f"estimate={self.estimate}, {state})"
        )

    def claim(self, owner: object) -> bool:
        """Mark it settled for ``owner``; whether the backend must still be told.

        Args:
            owner: The limiter settling it.

        Raises:
            ValueError: Another limiter made it.
            RuntimeError: It was settled already.
        """
        if self._owner is not owner:
            raise ValueError(f"{self!r} was made by another limiter")
        if self.settled:
            raise RuntimeError(f"{self!r} is settled already: settle a reservation once")
        self.settled = True
        return self.decision.allowed and self.at_us is not None


def metered_mask(policies: Sequence[Policy], metered: Sequence[Policy] | None) -> tuple[bool, ...]:
    """Which of ``policies`` a reservation's estimate meters (None: all of them)."""
    if metered is None:
        return (True,) * len(policies)
    if isinstance(metered, POLICY_CLASSES):
        raise TypeError("metered takes a list of policies, not one policy")
    for policy in metered:
        if policy not in policies:
            raise ValueError(f"metered policy {policy!r} is not one of the limiter's policies")
    if not metered:
        raise ValueError("metered needs at least one policy (or None: all of them)")
    return tuple(p in metered for p in policies)


def reserved_costs(
    policies: Sequence[Policy], mask: Sequence[bool], estimate: int
) -> tuple[int, ...]:
    """Each policy's cost of a reservation: the estimate if metered, else 1.

    Raises TypeError or ValueError for an estimate that is not a whole number of units
    that every metered policy could admit.
    """
    if isinstance(estimate, bool) or not isinstance(estimate, int):
        raise TypeError(f"estimate must be an int, not {type(estimate).__name__}")
    if estimate < 0:
        raise ValueError(f"estimate must be >= 0, got {estimate}")
    for policy, metered in zip(policies, mask, strict=True):
        if metered and estimate > policy.limit:
            raise ValueError(
                f"estimate {estimate} can never be admitted: {policy!r} admits {policy.limit}"
            )
    return tuple(estimate if m else 1 for m in mask)


def settled_costs(charged: Sequence[int], mask: Sequence[bool], actual: int) -> tuple[int, ...]:
    """Each policy's settled cost: the actual cost if metered, else what it was charged."""
    if isinstance(actual, bool) or not isinstance(actual, int):
        raise TypeError(f"actual must be an int, not {type(actual).__name__}")
    if not 0 <= actual <= MAX_UNITS:
        raise ValueError(f"actual must be between 0 and {MAX_UNITS}, got {actual}")
    return tuple(actual if m else c for c, m in zip(charged, mask, strict=True))


def expiry(now: float, ttl: float) -> float:
    """When a reservation made at ``now`` stops settling."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise TypeError(f"ttl must be a number of seconds, not {type(ttl).__name__}")
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"ttl must be finite and > 0, got {ttl!r}")
    return now + ttl
