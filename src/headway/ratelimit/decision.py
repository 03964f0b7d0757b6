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
    "decision_from_decide",
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
    """One policy's part of a decision.

    Attributes:
        policy: The policy.
        allowed: Whether it admitted the request.
        remaining: Units it could still admit right after this decision.
        reset_after: Seconds until its quota is whole again.
        retry_after: Seconds before a retry of the same cost could pass it (0 when
            admitted).
    """

    policy: Policy
    allowed: bool
    remaining: int
    reset_after: float
    retry_after: float


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a request may proceed, and what a client should be told.

    A decision is true when allowed (``if await limiter.hit(key): ...``).

    Attributes:
        allowed: Whether the request may proceed (every policy admitted it).
        limit: ``policy``'s limit (or capacity), in units.
        remaining: What could still be admitted right after this decision, in units.
        reset_after: Seconds until ``policy``'s quota is whole again.
        retry_after: Seconds before a retry of the same cost could succeed (0 when
            admitted).
        policy: The policy the numbers describe: the one that rejected with the
            longest wait, or, when admitted, the one with the fewest units left.
        source: Whether the backend decided, the blocked-key cache, or a failure mode
            (then ``remaining`` and ``reset_after`` are unknown, 0).
        policies: Every policy's own numbers (empty for failure modes).
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


# A decision is built per request, and a frozen dataclass's ``__init__`` sets each field
# through ``object.__setattr__``. So ``_part`` and ``_decision`` build each value as an
# instance of a writable class with the very same slots, then set its ``__class__`` to the
# frozen one (CPython allows that between classes of one layout; the check below fails at
# import if the fields change): the same objects, equal, hashable and immutable once made.
# Measured against the constructors (docs/decisions/ratelimit.md, "Plain values on the hot path"):
# a leased ``hit`` 0.7-0.9 -> 1.6-1.8 us p50 without it; a ``hit`` on Redis 89,300 ->
# 105,600 client instructions (one policy), 112,000 -> 140,600 (three).
_P_FIELDS = ("policy", "allowed", "remaining", "reset_after", "retry_after")
_D_FIELDS = (
    "allowed", "limit", "remaining", "reset_after", "retry_after", "policy", "source", "policies"
)  # fmt: skip


def _same_layout(cls: type, names: tuple[str, ...]) -> None:
    if (
        tuple(f.name for f in dataclasses.fields(cls)) != names
        or getattr(cls, "__slots__", ()) != names
    ):
        raise RuntimeError(f"{cls.__name__}'s fields changed: update ``_part`` and ``_decision``")


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
    policies: tuple[PolicyDecision, ...]


def _part(
    policy: Policy, allowed: bool, remaining: int, reset_after: float, retry_after: float
) -> PolicyDecision:
    """``PolicyDecision(...)``, built on its writable twin (see above)."""
    part = _OpenPolicyDecision()
    part.policy = policy
    part.allowed = allowed
    part.remaining = remaining
    part.reset_after = reset_after
    part.retry_after = retry_after
    part.__class__ = PolicyDecision  # type: ignore[assignment]
    return part  # type: ignore[return-value]


def _decision(
    allowed: bool,
    limit: int,
    remaining: int,
    reset_after: float,
    retry_after: float,
    policy: Policy,
    parts: tuple[PolicyDecision, ...],
) -> Decision:
    """``Decision(..., Source.BACKEND, parts)``, built on its writable twin (see above)."""
    decision = _OpenDecision()
    decision.allowed = allowed
    decision.limit = limit
    decision.remaining = remaining
    decision.reset_after = reset_after
    decision.retry_after = retry_after
    decision.policy = policy
    decision.source = _BACKEND
    decision.policies = parts
    decision.__class__ = Decision  # type: ignore[assignment]
    return decision  # type: ignore[return-value]


def admitted(policy: Policy, remaining: int, reset_after: float) -> Decision:
    """One policy's admitting decision from the backend: a leased decision's value.

    Equal to ``decision_from_reply((1, 1, remaining, reset_us, 0), (policy,))``.
    """
    part = _part(policy, True, remaining, reset_after, 0.0)
    return _decision(True, policy.limit, remaining, reset_after, 0.0, policy, (part,))


def _one(
    policy: Policy, allowed: bool, ok: bool, remaining: int, reset_us: int, retry_us: int
) -> Decision:
    """One policy's decision: it is the chosen one."""
    reset, retry = reset_us / 1e6, retry_us / 1e6
    parts = (_part(policy, ok, remaining, reset, retry),)
    return _decision(
        allowed, policy.limit, remaining, reset, 0.0 if allowed else retry, policy, parts
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
            _part(p, reply[i] == 1, reply[i + 1], reply[i + 2] / 1e6, reply[i + 3] / 1e6)
            for p, i in zip(policies, range(1, len(reply), 4), strict=True)
        ]
    )
    if allowed:
        chosen = min(parts, key=lambda d: (d.remaining, -d.reset_after))
    else:
        chosen = max((d for d in parts if not d.allowed), key=lambda d: d.retry_after)
    return _decision(
        allowed,
        chosen.policy.limit,
        chosen.remaining,
        chosen.reset_after,
        0.0 if allowed else chosen.retry_after,
        chosen.policy,
        parts,
    )


def decision_from_decide(reply: int | Sequence[int], policies: Sequence[Policy]) -> Decision:
    """The decision in the reply of ``ratelimit/decide_one.lua`` or ``decide.lua``.

    ``decide_one.lua`` answers one integer when it can (see its header): ``n`` admitted,
    ``-1 - n`` refused with retry = reset, where ``n = reset_us * (limit + 1) +
    remaining``; any other reply is ``decide.lua``'s list (``decision_from_reply``).
    """
    if not isinstance(reply, int):
        return decision_from_reply(reply, policies)
    policy = policies[0]
    if reply >= 0:
        reset_us, remaining = divmod(reply, policy.limit + 1)
        return _one(policy, True, True, remaining, reset_us, 0)
    reset_us, remaining = divmod(-1 - reply, policy.limit + 1)
    return _one(policy, False, False, remaining, reset_us, reset_us)


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
