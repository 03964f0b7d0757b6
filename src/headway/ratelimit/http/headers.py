"""The IETF RateLimit header fields (draft-ietf-httpapi-ratelimit-headers-11), and refusals; pure.

``RateLimit-Policy`` and ``RateLimit`` are Structured Field Lists (RFC 9651),
one Item per policy: the policy's name as a String, with parameters ``q``
(quota) and ``w`` (window) for the policy, ``r`` (available quota) and ``t``
(effective window) for the current service limit, all integers, times in
whole seconds::

    RateLimit-Policy: "burst";q=10;w=1, "hourly";q=1000;w=3600
    RateLimit: "burst";r=0;t=1, "hourly";r=990;t=3600

Names are serialized by ``http_sf`` once, when a rule is built (which also
rejects names a String cannot carry); the per-request parameters are
non-negative integers, whose serialization is their decimal digits, so they
are formatted directly on the hot path. The tests hold every value to a
whole ``http_sf`` serialization and parse it with an independent parser.

``t`` is the effective window: seconds within which the client should use no
more than ``r``. headway gives the seconds until the policy's quota is whole
again (spending ``r`` within them is never refused on that policy's account);
for a policy that rejected the request, the seconds until a retry of the same
cost could succeed, which is also what ``Retry-After`` says, so ``Retry-After``
never points earlier than the end of that window. Times are rounded *up*: a
client that waits what it is told is never early.

The guard builds every response with ``response_fields`` (what an admitted
request's response gains) and ``refusal_for`` (a whole 429 or 503, problem+json,
whose body is ``refusal_problem``'s: the draft's ``quota-exceeded`` or
``temporary-reduced-capacity``, with ``violated-policies``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import http_sf

from headway._http import PROBLEM_BASE, PROBLEM_HEADERS, problem_json, problem_response
from headway.ratelimit.decision import Decision, PolicyDecision
from headway.ratelimit.policies import Policy
from headway.ratelimit.slots import Admission

if TYPE_CHECKING:  # rules serialize their items with this module: no import cycle at run time
    from headway.ratelimit.http.bound_rule import BoundRule
    from headway.ratelimit.http.rules import RuleAnswer

__all__ = [
    "CONCURRENCY_RETRY",
    "MAX_INTEGER",
    "QUOTA_EXCEEDED",
    "TEMPORARY_REDUCED_CAPACITY",
    "Refusal",
    "admission_item",
    "concurrency_item",
    "legacy_headers",
    "limit_items",
    "policy_item",
    "refusal_for",
    "refusal_problem",
    "refusal_wait",
    "response_fields",
    "retry_after",
    "seconds",
    "sf_string",
    "slot_lost",
]

#: ``Retry-After`` (and ``t``) when every concurrency slot is in use, in seconds.
CONCURRENCY_RETRY = 1

#: The problem types of draft-ietf-httpapi-ratelimit-headers-11 (section 5) that headway
#: answers: a refusal (429), and a rule that failed closed (503).
QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
TEMPORARY_REDUCED_CAPACITY = (
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

Headers = list[tuple[bytes, bytes]]
#: A response refusing a request: status, headers, problem+json body.
Refusal = tuple[int, Headers, bytes]

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


def response_fields(checked: Sequence[tuple[BoundRule, RuleAnswer]], legacy: bool) -> Headers:
    """``RateLimit-Policy`` and ``RateLimit`` (and legacy fields if asked) for the response.

    ``checked`` pairs each rule that ran with its answer (a rule with a rate
    policy and an in-flight limit has two entries).
    """
    if len(checked) == 1:  # the usual case: one rule, one rate decision
        rule, answer = checked[0]
        head = [(b"ratelimit-policy", rule.policy_field)]
        if not isinstance(answer, Decision):
            if items := admission_item(rule.slot_header, answer):
                head.append((b"ratelimit", ", ".join(items).encode()))
        elif items := limit_items(rule.header_names, answer):  # none when it failed
            head.append((b"ratelimit", ", ".join(items).encode()))
            if legacy:
                head.extend(legacy_headers(answer))
        return head
    if not checked:
        return []
    seen: list[BoundRule] = []
    limits: list[str] = []
    for rule, answer in checked:
        if rule not in seen:
            seen.append(rule)
        if isinstance(answer, Decision):
            limits.extend(limit_items(rule.header_names, answer))
        else:
            limits.extend(admission_item(rule.slot_header, answer))
    # Each rule's items are serialized once, ASCII: joining bytes is joining the items.
    policies = seen[0].policy_field if len(seen) == 1 else b", ".join(r.policy_field for r in seen)
    head = [(b"ratelimit-policy", policies)]
    if limits:
        head.append((b"ratelimit", ", ".join(limits).encode()))
    if legacy:
        known = [d for _, d in checked if isinstance(d, Decision) and not d.failed]
        if known:
            tightest = min(known, key=lambda d: (d.allowed, d.remaining, -d.retry_after))
            head.extend(legacy_headers(tightest))
    return head


def refusal_for(
    rule: BoundRule,
    answer: RuleAnswer,
    checked: Sequence[tuple[BoundRule, RuleAnswer]],
    legacy: bool,
) -> Refusal:
    """Status, headers and problem+json body refusing a request that ``rule`` refused.

    The body is ``refusal_problem``'s; the headers add ``Retry-After`` and the
    rate-limit fields of every rule that ran.
    """
    wait = refusal_wait(answer, checked)
    problem = refusal_problem(rule, answer, wait)
    fields = [(b"retry-after", str(wait).encode()), *response_fields(checked, legacy)]
    return problem["status"], [*PROBLEM_HEADERS, *fields], problem_json(problem)


def refusal_wait(answer: RuleAnswer, checked: Sequence[tuple[BoundRule, RuleAnswer]]) -> int:
    """``Retry-After`` of a refusal, in whole seconds (at least 1)."""
    if answer.failed:
        return max(1, seconds(answer.retry_after))
    return retry_after(a for _, a in checked)


def refusal_problem(rule: BoundRule, answer: RuleAnswer, wait: int) -> dict[str, Any]:
    """The default problem (RFC 9457 members) refusing a request that ``rule`` refused.

    A refusal is draft -11's ``quota-exceeded`` (429); a rule that failed closed is
    its ``temporary-reduced-capacity`` (503): the limit could not be checked, so
    the request was not served. Both name the policies in ``violated-policies``.
    ``wait`` is the ``Retry-After`` the response carries (``refusal_wait``).
    """
    if answer.failed:
        return {
            "type": TEMPORARY_REDUCED_CAPACITY,
            "title": "Temporary Reduced Capacity",
            "status": 503,
            "detail": (
                f"The rate limit {rule.name!r} could not be checked; nothing was done. "
                f"Retry in {wait} s."
            ),
            "violated-policies": list(rule.names)
            if isinstance(answer, Decision)
            else [rule.slot_name],
        }
    if isinstance(answer, Decision):
        violated = [
            name for name, part in zip(rule.names, answer.policies, strict=True)
            if not part.allowed
        ] or rule.names[:1]  # fmt: skip
        what = "Too many requests"
    else:
        violated, what = [rule.slot_name], "Too many requests in flight"
    return {
        "type": QUOTA_EXCEEDED,
        "title": "Quota Exceeded",
        "status": 429,
        "detail": f"{what} for policy {', '.join(map(repr, violated))}; retry in {wait} s.",
        "violated-policies": violated,
    }


def slot_lost() -> Refusal:
    """503 for a request whose in-flight slot ended before its response began.

    ``hold()`` cancelled its handler (``LockLost``): a lease that cannot be renewed
    means the limit no longer counts the request, so it stops rather than run unlimited.
    """
    return problem_response(
        503, PROBLEM_BASE + "ratelimit-slot-lost", "Service Unavailable",
        "The request lost its in-flight slot before it finished and was stopped. Retry.",
        headers=[(b"retry-after", b"1")],
    )  # fmt: skip
