"""The decision a limiter returns, and how it is built from a backend's reply (pure)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from headway.ratelimit.policies import Policy

__all__ = [
    "Decision",
    "PolicyDecision",
    "Source",
    "admitted",
    "decision_from_reply",
    "fallback",
]


class Source(enum.Enum):
    """Who decided: the backend, the local blocked-key cache, or a failure mode."""

    BACKEND = "backend"
    CACHE = "cache"
    FAILED_OPEN = "failed_open"  # the backend failed or was too slow; policies say allow
    FAILED_CLOSED = "failed_closed"  # ... and at least one policy says deny


# Module constants: reading an enum member off its class costs ~0.1 µs, on the hot path.
_BACKEND = Source.BACKEND
_FAILED_OPEN = Source.FAILED_OPEN
_FAILED_CLOSED = Source.FAILED_CLOSED


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
        return self.source is _FAILED_OPEN or self.source is _FAILED_CLOSED

    def __bool__(self) -> bool:
        return self.allowed


# The one builder that bypasses the constructors. A leased decision is made in process,
# with no round trip beside it, and the frozen dataclasses' ``__init__`` (an
# ``object.__setattr__`` per field) doubled its time: a leased ``hit``'s p50 0.7-0.9 us
# -> 1.6-1.8 us with the constructors, decisions/s roughly halved (benchmarks/
# leasing_bench.py, docs/decisions.md "Plain values"). So ``admitted`` builds each value
# as an instance of a writable class with the very same slots, then sets its
# ``__class__`` to the frozen one (CPython allows that between classes of one layout): the
# same objects, equal, hashable and immutable once made. Every other decision is built by
# the constructors.
_P_FIELDS = ("policy", "allowed", "remaining", "reset_after", "retry_after")
_D_FIELDS = (
    "allowed", "limit", "remaining", "reset_after", "retry_after", "policy", "source", "policies"
)  # fmt: skip


def _same_layout(cls: type, names: tuple[str, ...]) -> None:
    if (
        tuple(f.name for f in dataclasses.fields(cls)) != names
        or getattr(cls, "__slots__", ()) != names
    ):
        raise RuntimeError(f"{cls.__name__}'s fields changed: update ``admitted``")


_same_layout(PolicyDecision, _P_FIELDS)
_same_layout(Decision, _D_FIELDS)


class _OpenPolicyDecision:
    """``PolicyDecision``'s slots, writable: built, then turned into a ``PolicyDecision``."""

    __slots__ = _P_FIELDS
    policy: Policy
    allowed: bool
    remaining: int
    reset_after: float
    retry_after: float


class _OpenDecision:
    """``Decision``'s slots, writable: built, then turned into a ``Decision``."""

    __slots__ = _D_FIELDS
    allowed: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: float
    policy: Policy
    source: Source
    policies: tuple[object, ...]


def admitted(policy: Policy, remaining: int, reset_after: float) -> Decision:
    """One policy's admitting decision from the backend: a leased decision's value.

    Equal to ``decision_from_reply((1, 1, remaining, reset_us, 0), (policy,))``, built
    without the constructors (see above).
    """
    part = _OpenPolicyDecision()
    part.policy = policy
    part.allowed = True
    part.remaining = remaining
    part.reset_after = reset_after
    part.retry_after = 0.0
    part.__class__ = PolicyDecision  # type: ignore[assignment]
    decision = _OpenDecision()
    decision.allowed = True
    decision.limit = policy.limit
    decision.remaining = remaining
    decision.reset_after = reset_after
    decision.retry_after = 0.0
    decision.policy = policy
    decision.source = _BACKEND
    decision.policies = (part,)
    decision.__class__ = Decision  # type: ignore[assignment]
    return decision  # type: ignore[return-value]


def _one(
    policy: Policy, allowed: bool, ok: bool, remaining: int, reset_us: int, retry_us: int
) -> Decision:
    """One policy's decision: it is the chosen one."""
    reset, retry = reset_us / 1e6, retry_us / 1e6
    parts = (PolicyDecision(policy, ok, remaining, reset, retry),)
    return Decision(
        allowed, policy.limit, remaining, reset, 0.0 if allowed else retry, policy, _BACKEND, parts
    )


def decision_from_reply(reply: Sequence[int], policies: Sequence[Policy]) -> Decision:
    """The decision in ``ratelimit/decide.lua``'s reply (which the reference model gives too).

    The reply is ``[allowed, then per policy: ok, remaining, reset_us, retry_us]``,
    integers (as hiredis reads them); one policy's is read without a loop.
    """
    if len(reply) == 5 and len(policies) == 1:
        allowed, ok, remaining, reset_us, retry_us = reply
        return _one(policies[0], allowed == 1, ok == 1, remaining, reset_us, retry_us)
    allowed = reply[0] == 1
    parts = tuple(
        [
            PolicyDecision(p, reply[i] == 1, reply[i + 1], reply[i + 2] / 1e6, reply[i + 3] / 1e6)
            for p, i in zip(policies, range(1, len(reply), 4), strict=True)
        ]
    )
    if allowed:
        chosen = min(parts, key=lambda d: (d.remaining, -d.reset_after))
    else:
        chosen = max((d for d in parts if not d.allowed), key=lambda d: d.retry_after)
    return Decision(
        allowed,
        chosen.policy.limit,
        chosen.remaining,
        chosen.reset_after,
        0.0 if allowed else chosen.retry_after,
        chosen.policy,
        _BACKEND,
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
