"""The decision a limiter returns, and how it is built (pure functions)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ._model import Verdict
from ._policies import Policy

__all__ = ["Decision", "PolicyDecision", "Source", "decision_from", "fallback"]


class Source(enum.Enum):
    """Who decided: the backend, the local blocked-key cache, or a failure mode."""

    BACKEND = "backend"
    CACHE = "cache"
    FAILED_OPEN = "failed_open"  # the backend failed or was too slow; policies say allow
    FAILED_CLOSED = "failed_closed"  # ... and at least one policy says deny


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """One policy's part of a decision (times in seconds)."""

    policy: Policy
    allowed: bool
    remaining: int
    reset_after: float
    retry_after: float


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a request may proceed, and what a client should be told.

    ``policy`` is the policy the numbers describe: the one that rejected with
    the longest wait, or, when admitted, the one with the fewest units left.
    ``remaining`` is what could still be admitted right after this decision;
    ``reset_after`` the seconds until that policy's quota is whole again;
    ``retry_after`` the seconds before a retry of the same cost could succeed
    (0 when admitted). ``source`` tells whether the backend decided or a
    failure mode did (then ``remaining`` and ``reset_after`` are unknown, 0).
    ``policies`` holds every policy's own numbers (empty for failure modes).
    """

    allowed: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: float
    policy: Policy
    source: Source = Source.BACKEND
    policies: tuple[PolicyDecision, ...] = ()

    @property
    def failed(self) -> bool:
        """True when the backend did not decide (a failure mode answered instead)."""
        return self.source in (Source.FAILED_OPEN, Source.FAILED_CLOSED)

    def __bool__(self) -> bool:
        return self.allowed


def decision_from(verdict: Verdict, policies: Sequence[Policy]) -> Decision:
    """Turn a backend's verdict into a decision."""
    parts = tuple(
        [
            PolicyDecision(p, ok, remaining, reset_us / 1e6, retry_us / 1e6)
            for p, (ok, remaining, reset_us, retry_us) in zip(
                policies, verdict.outcomes, strict=True
            )
        ]
    )
    if len(parts) == 1:
        chosen = parts[0]
    elif verdict.allowed:
        chosen = min(parts, key=lambda d: (d.remaining, -d.reset_after))
    else:
        chosen = max((d for d in parts if not d.allowed), key=lambda d: d.retry_after)
    return Decision(
        verdict.allowed,
        chosen.policy.limit,
        chosen.remaining,
        chosen.reset_after,
        0.0 if verdict.allowed else chosen.retry_after,
        chosen.policy,
        Source.BACKEND,
        parts,
    )


def fallback(policies: Sequence[Policy], retry_after: float) -> Decision:
    """The decision when the backend failed: deny if any policy says so, else allow."""
    deny = [p for p in policies if p.on_error == "deny"]
    policy = deny[0] if deny else policies[0]
    return Decision(
        allowed=not deny,
        limit=policy.limit,
        remaining=0,
        reset_after=0.0,
        retry_after=retry_after if deny else 0.0,
        policy=policy,
        source=Source.FAILED_CLOSED if deny else Source.FAILED_OPEN,
    )
