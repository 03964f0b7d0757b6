"""The limiter's argument checks: policies, costs, numbers of seconds."""

from __future__ import annotations

import math
from collections.abc import Sequence

from headway.ratelimit.algorithms import POLICY_CLASSES, PolicySet
from headway.ratelimit.policies import Policy

__all__ = ["check_cost", "check_policies", "check_seconds"]


def check_policies(policies: Sequence[Policy]) -> PolicySet:
    """At least one policy, each a policy value, no two alike (they would share state)."""
    if not policies:
        raise ValueError("a rate limiter needs at least one policy")
    for policy in policies:
        if not isinstance(policy, POLICY_CLASSES):
            raise TypeError(f"not a rate-limit policy: {policy!r}")
    parts = [p.key_part for p in policies]
    if len(set(parts)) != len(parts):
        raise ValueError(f"two policies with the same parameters: {list(policies)!r}")
    return PolicySet(policies)


def check_cost(cost: int, policies: Sequence[Policy]) -> int:
    """A cost is a whole number of units that every policy could admit at least once."""
    if cost == 1 and type(cost) is int:  # the usual case, checked first (hot path)
        return cost
    if isinstance(cost, bool) or not isinstance(cost, int):
        raise TypeError(f"cost must be an int, not {type(cost).__name__}")
    if cost < 1:
        raise ValueError(f"cost must be >= 1, got {cost}")
    smallest = min(policies, key=lambda p: p.limit)
    if cost > smallest.limit:
        raise ValueError(f"cost {cost} can never be admitted: {smallest!r} admits {smallest.limit}")
    return cost


def check_seconds(name: str, value: float) -> float:
    """A finite, non-negative number of seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return float(value)
