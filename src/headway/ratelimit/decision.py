"""The decision a limiter returns, and how it is built from a backend's reply (pure)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from headway.ratelimit.policies import Policy

__all__ = [
    "Decision",
    "PolicyDecision",
    "Source",
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


# A decision is built per request. The ``__init__`` of a frozen dataclass sets each
# field through ``object.__setattr__``, about three times what setting the slot through
# its descriptor costs, so ``decision_from_reply`` builds its values with the two functions
# below: the same objects (equal, hashable, immutable), made at a third of the cost.
_new = object.__new__


def _setters(cls: type, names: tuple[str, ...]) -> list[Callable[[object, object], None]]:
    if tuple(f.name for f in dataclasses.fields(cls)) != names:
        raise RuntimeError(f"{cls.__name__}'s fields changed: update its fast constructor")
    return [cls.__dict__[name].__set__ for name in names]


_P_POLICY, _P_ALLOWED, _P_REMAINING, _P_RESET, _P_RETRY = _setters(
    PolicyDecision, ("policy", "allowed", "remaining", "reset_after", "retry_after")
)
_D_ALLOWED, _D_LIMIT, _D_REMAINING, _D_RESET, _D_RETRY, _D_POLICY, _D_SOURCE, _D_PARTS = _setters(
    Decision,
    ("allowed", "limit", "remaining", "reset_after", "retry_after", "policy", "source", "policies"),
)


def _part(
    policy: Policy, allowed: bool, remaining: int, reset_after: float, retry_after: float
) -> PolicyDecision:
    """``PolicyDecision(...)``, fast (see above)."""
    part = _new(PolicyDecision)
    _P_POLICY(part, policy)
    _P_ALLOWED(part, allowed)
    _P_REMAINING(part, remaining)
    _P_RESET(part, reset_after)
    _P_RETRY(part, retry_after)
    return part


def _decision(
    allowed: bool,
    limit: int,
    remaining: int,
    reset_after: float,
    retry_after: float,
    policy: Policy,
    parts: tuple[PolicyDecision, ...],
) -> Decision:
    """``Decision(..., Source.BACKEND, parts)``, fast (see above)."""
    decision = _new(Decision)
    _D_ALLOWED(decision, allowed)
    _D_LIMIT(decision, limit)
    _D_REMAINING(decision, remaining)
    _D_RESET(decision, reset_after)
    _D_RETRY(decision, retry_after)
    _D_POLICY(decision, policy)
    _D_SOURCE(decision, _BACKEND)
    _D_PARTS(decision, parts)
    return decision


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
