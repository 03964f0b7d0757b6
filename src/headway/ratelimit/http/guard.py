"""The part the middleware and the decorator share: rule on one request, top down.

``Guard.decide`` finds the route template (only if something reads it), lets
``exempt`` routes through, asks each rule whether it applies, runs the rules
that do, in order, one limiter decision (one round trip) each, and stops at
the first rule that rejects (rules after it are not charged; rules before it
keep their charge, as with any limiter chain). It reports every decision to
the hook, counts it, logs outages once (``reporting``), and returns a
``Ruling`` built with the ``headers`` module: the header fields to add, or the
whole refusal (429 with problem+json, or 503 when a rule fails closed), and
the concurrency slots the request holds. An ``on_refusal`` hook may reshape the refusal
(``refusals``); a rule whose policies are a function of the request resolves
them first (``dynamic``). With ``max_wait``, a refused request waits for
admission in a line per key (``ratelimit/waiting.py``) before it is refused;
only its last decision is counted and reported.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
from collections.abc import Sequence
from typing import NamedTuple

from starlette.responses import Response

from headway._clock import MonotonicClock
from headway._errors import ConcurrencyLimitExceeded
from headway._http import Scope
from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.backends.memory import MemoryRateLimitBackend
from headway.ratelimit.concurrency import ConcurrencyLimiter
from headway.ratelimit.decision import Decision
from headway.ratelimit.http.bound_rule import BoundRule
from headway.ratelimit.http.dynamic import DynamicPolicies
from headway.ratelimit.http.headers import Refusal, refusal_for, response_fields
from headway.ratelimit.http.identity import ClientAddress, Identity
from headway.ratelimit.http.metering import METER, Meter, Metering, Reserving
from headway.ratelimit.http.refusals import RefusalHook, Refuser
from headway.ratelimit.http.reporting import (
    DecisionHook,
    DecisionOutcome,
    OutageLog,
    RateLimitEvent,
    report,
)
from headway.ratelimit.http.routes import RouteFunction
from headway.ratelimit.http.rules import (
    LimiterSettings,
    Pattern,
    Rule,
    RuleAnswer,
    matches_any,
    validated_patterns,
)
from headway.ratelimit.limiter import RateLimiter
from headway.ratelimit.slots import Admission
from headway.ratelimit.waiting import DEFAULT_MAX_WAITING, Gone, WaitLines, check_waiting

__all__ = ["Guard", "Ruling"]

log = logging.getLogger("headway.ratelimit")


class Ruling(NamedTuple):
    """What the guard ruled on one request (a named tuple: one is built per request).

    ``headers``: the RateLimit fields to add to the app's response (empty when
    no rule applied). ``refusal``: status, headers and body of the response
    refusing the request (or the ``on_refusal`` hook's ``Response``), or None.
    ``slots``: the concurrency slots the request holds, or None; ``aclose()`` gives
    them all back (at most once): call it when the response ends, the client leaves,
    or the app returns or raises.
    """

    headers: Sequence[tuple[bytes, bytes]]
    refusal: Refusal | Response | None
    slots: contextlib.AsyncExitStack | None


#: The ruling on a request no rule applies to (shared: it holds nothing).
NO_RULE_APPLIED = Ruling((), None, None)


class Guard:
    """Bound rules plus what every request shares: route lookup, hook, counters, outage log.

    ``identity`` is the rules' default (the socket peer's address when None);
    ``exempt`` routes skip every rule; ``route`` finds a request's template.
    ``max_wait`` (seconds) lets a refused request wait for admission, at most
    ``max_waiting`` of them at once.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        backend: RateLimitBackend | None,
        identity: Identity | Sequence[Identity] | None,
        route: RouteFunction,
        exempt: Sequence[Pattern] = (),
        shadow: bool = False,
        on_decision: DecisionHook | None = None,
        legacy_headers: bool = False,
        limiter: LimiterSettings | None = None,
        on_refusal: RefusalHook | None = None,
        max_wait: float = 0.0,
        max_waiting: int = DEFAULT_MAX_WAITING,
    ) -> None:
        if isinstance(rules, Rule):
            raise TypeError("rules takes a list of Rule, not one Rule")
        names = [r.name for r in rules]
        if len(set(names)) != len(names):
            raise ValueError(f"rule names must be unique (they name quotas): {names!r}")
        backend = backend or MemoryRateLimitBackend()
        settings = limiter or LimiterSettings()
        default_identity = identity if identity is not None else ClientAddress()
        self.rules = [BoundRule(rule, backend, default_identity, settings) for rule in rules]
        for bound in self.rules:
            if bound.rule.dynamic:
                bound.dynamic = DynamicPolicies(bound, backend, default_identity, settings)
        self.refuser = Refuser(on_refusal) if on_refusal is not None else None
        header_names = [n for r in self.rules for n in r.names]
        if len(set(header_names)) != len(header_names):
            raise ValueError(f"policy names must be unique across rules: {header_names!r}")
        self.route = route
        self.exempt = validated_patterns("exempt", exempt)
        self.shadow = shadow
        self.on_decision = on_decision
        self.legacy = legacy_headers
        # Finding the template walks the router: skip it when nothing reads it (no
        # pattern, no per-route quota, no hook to report it).
        self.reads_route = (
            bool(self.exempt) or on_decision is not None or any(r.reads_route for r in self.rules)
        )
        #: Decisions by (rule name, outcome): feed them to your metrics, or use the hook.
        self.counts: collections.Counter[tuple[str, DecisionOutcome]] = collections.Counter()
        clock = settings.clock or MonotonicClock()
        self.outages = {r.name: OutageLog(r.name, clock) for r in self.rules}
        self.clock = clock
        self.max_wait, max_waiting = check_waiting(max_wait, max_waiting)
        #: Where refused requests wait for admission (``max_wait`` > 0), else None.
        self.lines = WaitLines(clock, max_waiting) if self.max_wait > 0 else None

    async def decide(self, scope: Scope, method: str, gone: Gone | None = None) -> Ruling:
        """Rule on one request (see the module docstring).

        With ``max_wait``, a request a rate policy refuses waits in its key's line
        (``ratelimit/waiting.py``) until admitted or out of time; ``gone`` watches its
        client, and raises ``ClientGone`` out of here when the client leaves.
        """
        lines = self.lines
        deadline = 0.0 if lines is None else self.clock() + self.max_wait
        route = self.route(scope) if self.reads_route else None
        path: str = scope.get("path", "")
        if self.exempt and matches_any(self.exempt, route if route is not None else path):
            return NO_RULE_APPLIED
        checked: list[tuple[BoundRule, RuleAnswer]] = []
        slots: contextlib.AsyncExitStack | None = None
        for rule in self.rules:
            if not rule.applies(method, route, path):
                continue
            known = rule.sync_identity
            identity = known(scope) if known is not None else await rule.identify(scope)
            if identity is None:
                continue
            if rule.dynamic is not None:
                resolved = await rule.dynamic.resolve(scope)
                if isinstance(resolved, Decision):  # not policies: the rule's failure mode
                    if await self._unresolved(rule, identity, route, method, resolved):
                        return await self._refuse(rule, resolved, checked, scope, slots)
                    continue
                rule = resolved
            key = rule.key(identity, route, path)
            shadow = self.shadow or rule.shadow
            limiter = rule.limiter
            rate: Decision | None
            if rule.metering is not None and limiter is not None:
                cost, rate, slots = await self._metered(
                    rule.metering, limiter, scope, key, shadow, deadline, gone, slots
                )
            else:
                fixed = rule.fixed_cost
                cost = fixed if fixed is not None else await rule.cost(scope)
                if limiter is None:
                    rate = None
                elif lines is None or shadow:  # a shadow rule never refuses: nothing to wait
                    # ``decide``, not ``hit`` (which awaits it): one coroutine less per request.
                    rate = await limiter.decide(key, cost)
                else:
                    hit = functools.partial(limiter.decide, key, cost)
                    rate = await lines.admit((limiter, key), hit, deadline, gone)
            held: Admission | None = None
            if rule.concurrency is not None and (rate is None or rate.allowed or shadow):
                held, slots = await _take_slot(slots, rule.concurrency, key)
            answers = [answer for answer in (rate, held) if answer is not None]
            checked.extend((rule, answer) for answer in answers)
            refused = await self._tally(rule, answers, shadow, identity, route, method, path, cost)
            if refused is not None:
                return await self._refuse(rule, refused, checked, scope, slots)
        if not checked:
            return NO_RULE_APPLIED
        return Ruling(response_fields(checked, self.legacy), None, slots)

    async def _metered(
        self,
        metering: Metering,
        limiter: RateLimiter,
        scope: Scope,
        key: str,
        shadow: bool,
        deadline: float,
        gone: Gone | None,
        slots: contextlib.AsyncExitStack | None,
    ) -> tuple[int, Decision, contextlib.AsyncExitStack | None]:
        """Reserve a metered rule's estimate: its cost, the decision, and the request's slots.

        Waits in the key's line as ``decide`` does (each try in the line reserves; only an
        admitted one charges). The settle goes on ``slots`` (made if None), closed when the
        response ends.
        """
        cost = await metering.estimate_for(scope)
        reserving = Reserving(scope, metering, limiter, key, cost)
        lines = self.lines
        if lines is None or shadow:
            rate = await reserving()
        else:
            rate = await lines.admit((limiter, key), reserving, deadline, gone)
        if (settles := reserving.settles()) is not None:  # the request's first
            slots = slots if slots is not None else contextlib.AsyncExitStack()
            slots.push_async_callback(settles)
        return cost, rate, slots

    async def _tally(
        self,
        rule: BoundRule,
        answers: Sequence[RuleAnswer],
        shadow: bool,
        identity: str,
        route: str | None,
        method: str,
        path: str,
        cost: int,
    ) -> RuleAnswer | None:
        """Count a rule's answers and report each to the hook; the refusal to enforce.

        Returns the first answer that refuses, unless the rule is ``shadow`` (then the
        refusal is only logged), else None.
        """
        for answer in answers:
            outcome = self._note(rule, answer)
            if self.on_decision is not None:
                event = RateLimitEvent(
                    rule.name, identity, route, method, cost, answer, outcome,
                    shadow and not answer.allowed,
                )  # fmt: skip
                await report(self.on_decision, event)
        refused = next((answer for answer in answers if not answer.allowed), None)
        if refused is None or not shadow:
            return refused
        log.info("shadow: rule %r would refuse %s %s for %s", rule.name, method, path,
                 identity)  # fmt: skip
        return None

    async def _unresolved(
        self, rule: BoundRule, identity: str, route: str | None, method: str, failed: Decision
    ) -> bool:
        """Count and report a dynamic rule without policies; whether to refuse the request.

        The event's cost is 0: nothing was charged.
        """
        event = RateLimitEvent(
            rule.name, identity, route, method, 0, failed, "errored",
            (self.shadow or rule.shadow) and not failed.allowed,
        )  # fmt: skip
        self.counts[event.rule, "errored"] += 1
        if self.on_decision is not None:
            await report(self.on_decision, event)
        if event.shadow:
            log.info("shadow: rule %r would refuse %s (no policies)", event.rule, event.method)
        return not event.decision.allowed and not event.shadow

    async def _refuse(
        self,
        rule: BoundRule,
        answer: RuleAnswer,
        checked: Sequence[tuple[BoundRule, RuleAnswer]],
        scope: Scope,
        slots: contextlib.AsyncExitStack | None,
    ) -> Ruling:
        refusal = refusal_for(rule, answer, checked, self.legacy)
        if isinstance(meter := scope.get(METER), Meter):
            meter.refused = True  # the work never runs: reservations settle at 0
        if self.refuser is None:
            return Ruling((), refusal, slots)
        return Ruling((), await self.refuser(rule, answer, refusal, scope), slots)

    def _note(self, rule: BoundRule, answer: RuleAnswer) -> DecisionOutcome:
        outcome: DecisionOutcome
        outages = self.outages[rule.name]
        if answer.failed:
            outcome = "errored"
            outages.failure("open" if answer.allowed else "closed")
        else:
            outcome = "allowed" if answer.allowed else "rejected"
            if outages.failing:
                outages.success()
        self.counts[rule.name, outcome] += 1
        return outcome


async def _take_slot(
    slots: contextlib.AsyncExitStack | None, limiter: ConcurrencyLimiter, key: str
) -> tuple[Admission, contextlib.AsyncExitStack]:
    """Hold a slot on ``key`` (renewed while held) until ``slots`` (made if None) is closed."""
    slots = slots if slots is not None else contextlib.AsyncExitStack()
    try:
        return await slots.enter_async_context(limiter.hold(key)), slots
    except ConcurrencyLimitExceeded as exc:
        return exc.admission, slots
