"""The part the middleware and the decorator share: check a request against bound rules.

``Guard.check`` runs every rule that applies, in order, one limiter decision
(one round trip) each, and stops at the first rule that rejects (rules after
it are not charged; rules before it keep their charge, as with any limiter
chain). It reports every decision to the hook, counts it, logs outages once,
and returns a ``Check``: the header fields to add and, if the request is
refused, the refusal (429 with problem+json, or 503 when a rule fails closed).
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from headway._clock import Clock, MonotonicClock
from headway._errors import ConcurrencyLimitExceeded
from headway._http import PROBLEM_BASE, PROBLEM_HEADERS, Scope, problem_body
from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.backends.memory import MemoryRateLimitBackend
from headway.ratelimit.concurrency import ConcurrencyLimiter
from headway.ratelimit.decision import Decision
from headway.ratelimit.http.headers import (
    admission_item,
    legacy_headers,
    limit_items,
    retry_after,
    seconds,
)
from headway.ratelimit.http.identity import Identity
from headway.ratelimit.http.rules import BoundRule, Rule
from headway.ratelimit.slots import Admission

__all__ = ["Check", "DecisionHook", "Guard", "Outcome", "RateLimitEvent", "rules_need_route"]

log = logging.getLogger("headway.ratelimit")

Outcome = Literal["allowed", "rejected", "errored"]
Headers = list[tuple[bytes, bytes]]
#: A rule's answer: a rate decision, or an in-flight limit's admission.
Verdict = Decision | Admission

#: The problem type of draft-ietf-httpapi-ratelimit-headers for a 429.
QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"


@dataclass(frozen=True, slots=True)
class RateLimitEvent:
    """One decision, as the ``on_decision`` hook sees it.

    ``decision`` is the limiter's ``Decision``, or the ``Admission`` of a
    ``Concurrency`` limit. ``outcome`` is ``"errored"`` when the backend failed
    or was too slow (then ``decision.source`` tells whether the rule failed
    open or closed);
    ``shadow`` is True when a rejection was only reported, not enforced.
    """

    rule: str
    identity: str
    route: str | None
    method: str
    cost: int
    decision: Decision | Admission
    outcome: Outcome
    shadow: bool


DecisionHook = Callable[[RateLimitEvent], "Awaitable[None] | None"]


@dataclass(slots=True)
class Check:
    """What the guard decided for one request, and the concurrency slots it holds.

    ``checked`` pairs each rule that ran with its rate decision or, for an
    in-flight limit, its admission (a rule with both has two entries).
    ``release`` gives every slot back, at most once: the middleware calls it
    when the response ends, the client leaves, or the app returns or raises.
    """

    legacy: bool = False
    checked: list[tuple[BoundRule, Verdict]] = field(default_factory=list)
    blocking: tuple[BoundRule, Verdict] | None = None
    slots: list[contextlib.AsyncExitStack] = field(default_factory=list)

    async def release(self) -> None:
        """Release every slot this request holds (idempotent)."""
        while self.slots:
            await self.slots.pop().aclose()

    def headers(self) -> Headers:
        """``RateLimit-Policy`` and ``RateLimit`` (and legacy fields if asked) for the response."""
        checked = self.checked
        if len(checked) == 1:  # the usual case: one rule, one rate decision
            rule, verdict = checked[0]
            head = [(b"ratelimit-policy", rule.policy_field)]
            if not isinstance(verdict, Decision):
                if items := admission_item(rule.slot_header, verdict):
                    head.append((b"ratelimit", ", ".join(items).encode()))
            elif items := limit_items(rule.header_names, verdict):  # none when it failed
                head.append((b"ratelimit", ", ".join(items).encode()))
                if self.legacy:
                    head.extend(legacy_headers(verdict))
            return head
        if not checked:
            return []
        seen: list[BoundRule] = []
        limits: list[str] = []
        for rule, verdict in self.checked:
            if rule not in seen:
                seen.append(rule)
            if isinstance(verdict, Decision):
                limits.extend(limit_items(rule.header_names, verdict))
            else:
                limits.extend(admission_item(rule.slot_header, verdict))
        # Each rule's items are serialized once, ASCII: joining bytes is joining the items.
        policies = (
            seen[0].policy_field if len(seen) == 1 else b", ".join(r.policy_field for r in seen)
        )
        head = [(b"ratelimit-policy", policies)]
        if limits:
            head.append((b"ratelimit", ", ".join(limits).encode()))
        if self.legacy:
            known = [d for _, d in self.checked if isinstance(d, Decision) and not d.failed]
            if known:
                tightest = min(known, key=lambda d: (d.allowed, d.remaining, -d.retry_after))
                head.extend(legacy_headers(tightest))
        return head

    def refusal(self) -> tuple[int, Headers, bytes]:
        """Status, headers and problem+json body refusing the request (``blocking`` is set)."""
        assert self.blocking is not None
        rule, verdict = self.blocking
        if verdict.failed:
            wait = max(1, seconds(verdict.retry_after))
            body = problem_body(
                503, PROBLEM_BASE + "ratelimit-unavailable", "Service Unavailable",
                f"The rate limit {rule.name!r} could not be checked; nothing was done. "
                f"Retry in {wait} s.",
            )  # fmt: skip
        else:
            wait = retry_after(d for _, d in self.checked)
            if isinstance(verdict, Decision):
                violated = [
                    name for name, part in zip(rule.names, verdict.policies, strict=True)
                    if not part.allowed
                ] or rule.names[:1]  # fmt: skip
                what = "Too many requests"
            else:
                violated, what = [rule.slot_name], "Too many requests in flight"
            body = problem_body(
                429, QUOTA_EXCEEDED, "Quota Exceeded",
                f"{what} for policy {', '.join(map(repr, violated))}; retry in {wait} s.",
                {"violated-policies": violated},
            )  # fmt: skip
        status = 503 if verdict.failed else 429
        return (
            status,
            [*PROBLEM_HEADERS, (b"retry-after", str(wait).encode()), *self.headers()],
            body,
        )


def rules_need_route(rules: Sequence[BoundRule]) -> bool:
    """Whether the rules read the route template (else only the hook's event shows it)."""
    return any(rule.rule.routes or rule.rule.exempt or rule.rule.per == "route" for rule in rules)


class OutageLog:
    """One rule's backend outages, logged without flooding the log.

    A warning when decisions start failing (then at most one every ``every``
    seconds while they go on, with how many failed), and one line when the
    backend answers again after an outage that was reported.
    """

    def __init__(self, name: str, clock: Clock, every: float = 10.0) -> None:
        self.name = name
        self.clock = clock
        self.every = every
        self.failing = False
        self.reported = False  # this outage was announced
        self.failed = 0  # failed decisions since the last warning
        self.warned_at: float | None = None

    def failure(self, mode: str) -> None:
        """A decision failed (``mode``: the rule failed "open" or "closed")."""
        self.failing = True
        self.failed += 1
        now = self.clock()
        if self.warned_at is None or now - self.warned_at >= self.every:
            log.warning(
                "rate limit %r: backend failed or exceeded its budget; failing %s "
                "(%d failed decision(s) since the last report)",
                self.name, mode, self.failed,
            )  # fmt: skip
            self.warned_at, self.failed, self.reported = now, 0, True

    def success(self) -> None:
        """The backend decided."""
        if self.failing:
            if self.reported:
                log.warning("rate limit %r: backend answering again", self.name)
            self.failing = self.reported = False


async def _resolve(value: object) -> None:
    if inspect.isawaitable(value):
        await value


class Guard:
    """Bound rules plus what every check shares: hook, counters, shadow mode, outage log."""

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        backend: RateLimitBackend | None,
        identity: Identity | Sequence[Identity],
        shadow: bool = False,
        on_decision: DecisionHook | None = None,
        legacy_headers: bool = False,
        budget: float = 0.25,
        retry_on_error: float = 1.0,
        cache_blocked: bool | int = False,
        clock: Clock | None = None,
    ) -> None:
        if isinstance(rules, Rule):
            raise TypeError("rules takes a list of Rule, not one Rule")
        names = [r.name for r in rules]
        if len(set(names)) != len(names):
            raise ValueError(f"rule names must be unique (they name quotas): {names!r}")
        backend = backend or MemoryRateLimitBackend()
        self.rules = [
            BoundRule(
                rule, backend, identity, budget=budget, retry_on_error=retry_on_error,
                cache_blocked=cache_blocked, clock=clock,
            )
            for rule in rules
        ]  # fmt: skip
        header_names = [n for r in self.rules for n in r.names]
        if len(set(header_names)) != len(header_names):
            raise ValueError(f"policy names must be unique across rules: {header_names!r}")
        self.shadow = shadow
        self.on_decision = on_decision
        self.legacy = legacy_headers
        #: Decisions by (rule name, outcome): feed them to your metrics, or use the hook.
        self.counts: collections.Counter[tuple[str, Outcome]] = collections.Counter()
        clock = clock or MonotonicClock()
        self.outages = {r.name: OutageLog(r.name, clock) for r in self.rules}

    async def check(self, scope: Scope, method: str, route: str | None) -> Check:
        """Run the rules that apply to this request (see the module docstring)."""
        check = Check(self.legacy)
        path: str = scope.get("path", "")
        for rule in self.rules:
            if not rule.applies(method, route, path):
                continue
            known = rule.sync_identity
            identity = known(scope) if known is not None else await rule.identify(scope)
            if identity is None:
                continue
            cost = rule.fixed_cost
            if cost is None:
                cost = await rule.cost(scope)
            key = rule.key(identity, route, path)
            shadow = self.shadow or rule.shadow
            verdicts: list[Verdict] = []
            if rule.limiter is not None:
                # ``_decide`` is what ``hit`` awaits: one coroutine less per request.
                verdicts.append(await rule.limiter._decide(key, cost, False))
            if rule.concurrency is not None and (not verdicts or verdicts[0].allowed or shadow):
                verdicts.append(await self._take_slot(check, rule.concurrency, key))
            refused: Verdict | None = None
            for verdict in verdicts:
                check.checked.append((rule, verdict))
                outcome = self._note(rule, verdict)
                if self.on_decision is not None:
                    event = RateLimitEvent(
                        rule.name, identity, route, method, cost, verdict, outcome,
                        shadow and not verdict.allowed,
                    )  # fmt: skip
                    await self._report(event)
                if refused is None and not verdict.allowed:
                    refused = verdict
            if refused is not None:
                if shadow:
                    log.info("shadow: rule %r would refuse %s %s for %s", rule.name, method,
                             path, identity)  # fmt: skip
                    continue
                check.blocking = (rule, refused)
                break
        return check

    @staticmethod
    async def _take_slot(check: Check, limiter: ConcurrencyLimiter, key: str) -> Admission:
        """Hold a slot on ``key`` (renewed while held) until ``check.release()``."""
        stack = contextlib.AsyncExitStack()
        try:
            admission = await stack.enter_async_context(limiter.hold(key))
        except ConcurrencyLimitExceeded as exc:
            return exc.admission
        check.slots.append(stack)
        return admission

    def _note(self, rule: BoundRule, decision: Verdict) -> Outcome:
        outcome: Outcome
        outages = self.outages[rule.name]
        if decision.failed:
            outcome = "errored"
            outages.failure("open" if decision.allowed else "closed")
        else:
            outcome = "allowed" if decision.allowed else "rejected"
            if outages.failing:
                outages.success()
        self.counts[rule.name, outcome] += 1
        return outcome

    async def _report(self, event: RateLimitEvent) -> None:
        assert self.on_decision is not None
        try:
            result = self.on_decision(event)
            if result is not None:  # a sync hook returns None: nothing to await
                await _resolve(result)
        except Exception:
            # A broken metrics hook must not break the requests it observes.
            log.exception("rate limit on_decision hook failed")
