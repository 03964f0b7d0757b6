"""The IETF RateLimit header fields (draft-ietf-httpapi-ratelimit-headers-10), pure.

``RateLimit-Policy`` and ``RateLimit`` are Structured Field Lists (RFC 9651),
one Item per policy: the policy's name as a String, with parameters ``q``
(quota) and ``w`` (window) for the policy, ``r`` (remaining) and ``t`` (reset)
for the current service limit, all integers, times in whole seconds::

    RateLimit-Policy: "burst";q=10;w=1, "hourly";q=1000;w=3600
    RateLimit: "burst";r=0;t=1, "hourly";r=990;t=3600

Names are serialized by ``http_sf`` once, when a rule is built (which also
rejects names a String cannot carry); the per-request parameters are
non-negative integers, whose serialization is their decimal digits, so they
are formatted directly on the hot path. The tests hold every value to a
whole ``http_sf`` serialization and parse it with an independent parser.

``t`` is the seconds until the policy's quota is whole again; for a policy
that rejected the request it is the seconds until a retry of the same cost
could succeed, which is also what ``Retry-After`` says, so ``Retry-After``
never points earlier than ``t``. Times are rounded *up*: a client that
waits what it is told is never early.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import http_sf

from headway.ratelimit.decision import Decision, PolicyDecision
from headway.ratelimit.policies import Policy
from headway.ratelimit.slots import Admission

__all__ = [
    "CONCURRENCY_RETRY",
    "MAX_INTEGER",
    "admission_item",
    "concurrency_item",
    "legacy_headers",
    "limit_items",
    "policy_item",
    "retry_after",
    "seconds",
    "sf_string",
]

#: ``Retry-After`` (and ``t``) when every concurrency slot is in use, in seconds.
CONCURRENCY_RETRY = 1

#: The largest Integer a Structured Field can carry (RFC 9651, 15 digits).
MAX_INTEGER = 999_999_999_999_999


def seconds(value: float) -> int:
    """Whole seconds for a header, rounded up, never negative."""
    if value <= 0:
        return 0
    return min(math.ceil(value), MAX_INTEGER)


def sf_string(name: str) -> str:
    """``name`` serialized as a Structured Field String (raises ValueError if it cannot be)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a policy name must be a non-empty str, got {name!r}")
    try:
        return str(http_sf.ser(name))
    except ValueError as exc:
        raise ValueError(f"policy name {name!r} is not a Structured Field String: {exc}") from None


def policy_item(name: str, policy: Policy, unit: str | None = None) -> str:
    """One ``RateLimit-Policy`` Item: ``"name";q=<limit>;w=<window>``.

    ``w`` is the window in whole seconds, rounded up (at least 1, as the
    draft requires): a sub-second policy is advertised as its quota over one
    second, which never overstates what a client may send. ``unit`` adds the
    ``qu`` parameter (``"concurrent-requests"`` for in-flight limits).
    """
    item = f"{sf_string(name)};q={policy.limit}"
    if unit is not None:
        item += f";qu={http_sf.ser(unit)}"
    return f"{item};w={max(1, seconds(policy.window))}"


def concurrency_item(name: str, limit: int) -> str:
    """A ``RateLimit-Policy`` Item for an in-flight limit (``qu="concurrent-requests"``).

    It has no window: the quota is slots held, not units per time.
    """
    return f'{sf_string(name)};q={limit};qu="concurrent-requests"'


def admission_item(name: str, admission: Admission) -> list[str]:
    """The ``RateLimit`` Item for an in-flight limit: free slots, and ``t`` when refused.

    A refusal's ``t`` (and so ``Retry-After``) is one second: a slot frees as
    soon as any request in flight ends, while the admission's own wait (the
    first lease's end) is only an upper bound.
    """
    if admission.failed:
        return []
    if admission.allowed:
        return [f"{name};r={admission.remaining}"]
    return [f"{name};r={admission.remaining};t={CONCURRENCY_RETRY}"]


def limit_items(names: Sequence[str], decision: Decision) -> list[str]:
    """The ``RateLimit`` Items for one decision (``names``: serialized, one per policy).

    A decision made by a failure mode knows no numbers, so it has no Item.
    """
    if decision.failed:
        return []
    parts = decision.policies
    if len(parts) == 1 == len(names):  # the usual case, on every response: no loop
        return [_limit_item(names[0], parts[0], decision)]
    return [_limit_item(name, part, decision) for name, part in zip(names, parts, strict=True)]


def _limit_item(name: str, part: PolicyDecision, decision: Decision) -> str:
    if part.allowed or decision.allowed:
        wait = part.reset_after
    else:
        # A cached rejection shortens the decision's wait, not the parts': take the smaller.
        wait = min(part.retry_after, decision.retry_after)
    return f"{name};r={min(part.remaining, MAX_INTEGER)};t={seconds(wait)}"


def retry_after(decisions: Iterable[Decision | Admission]) -> int:
    """``Retry-After`` for a rejection: the longest wait among rejecting decisions, >= 1 s."""
    waits = [
        d.retry_after if isinstance(d, Decision) else CONCURRENCY_RETRY
        for d in decisions
        if not d.allowed and not d.failed
    ]
    return max(1, seconds(max(waits, default=0.0)))


def legacy_headers(decision: Decision) -> list[tuple[bytes, bytes]]:
    """``X-RateLimit-Limit``/``-Remaining``/``-Reset`` (delta seconds) for one decision."""
    reset = decision.retry_after if not decision.allowed else decision.reset_after
    return [
        (b"x-ratelimit-limit", str(decision.limit).encode()),
        (b"x-ratelimit-remaining", str(decision.remaining).encode()),
        (b"x-ratelimit-reset", str(seconds(reset)).encode()),
    ]
