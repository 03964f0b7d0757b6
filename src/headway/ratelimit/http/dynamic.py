"""Dynamic policies: a rule whose ``policies`` is a function of the request (tiers).

``Rule(policies=tier_of)``, where ``tier_of(scope)`` (sync or async) returns
what ``Rule.policies`` takes, e.g. ``{"pro": TokenBucket(...)}`` for a pro
user. The function runs on every request the rule applies to once an
identity is found (it reads the request, usually the authenticated user
already on the scope; one that does I/O caches it itself, since only it
knows when a tier changes). What headway
caches is everything built from an answer: the validated rule, its limiter
and its serialized header items, keyed by the answer's value (policies are
frozen values), least recently used first out past ``CACHED_ANSWERS``. An
upgrade therefore applies on the next request, with no TTL to wait out.

Each policy has its own quota per identity: the engine's keys carry each
policy's parameters, so a user moving from ``free`` to ``pro`` starts with a
whole ``pro`` quota (and finds the ``free`` count where it was on moving
back), and two algorithms never share a key.
The RateLimit headers name the policies that applied (the mapping's names;
else the rule's name, as for a static rule).

An answer that is not policies (or a function that raises) is logged at its
first occurrence, then at most once every ``LOG_EVERY`` seconds, and the rule
falls back as its backend would: ``Rule.fail`` (``"open"`` by default, as a
policy's ``on_error``). Never a 500.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import logging
from collections.abc import Hashable, Mapping, Sequence

from headway._clock import Clock, MonotonicClock
from headway._http import Scope
from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.decision import Decision, Source
from headway.ratelimit.http.bound_rule import BoundRule
from headway.ratelimit.http.identity import Identity
from headway.ratelimit.http.rules import LimiterSettings
from headway.ratelimit.policies import FixedWindow

__all__ = ["CACHED_ANSWERS", "LOG_EVERY", "DynamicPolicies"]

log = logging.getLogger("headway.ratelimit")

#: Distinct answers (policy sets) kept built, per rule.
CACHED_ANSWERS = 256
#: Seconds between two logs of a rule's bad answers while they go on.
LOG_EVERY = 10.0

# A failure-mode decision names a policy; this one is never applied (its numbers unused).
_NO_POLICY = FixedWindow(limit=1, window=1.0)


def _hashable(answer: object) -> Hashable:
    """The cache key of an answer (TypeError if it cannot be one: it is not policies)."""
    if isinstance(answer, Mapping):
        key: Hashable = ("mapping", tuple(answer.items()))
    elif isinstance(answer, Sequence) and not isinstance(answer, str | bytes):
        key = ("sequence", tuple(answer))
    else:
        key = ("one", answer)
    hash(key)
    return key


class DynamicPolicies:
    """A dynamic rule's function, and the rules built from its answers."""

    def __init__(
        self,
        parent: BoundRule,
        backend: RateLimitBackend,
        default_identity: Identity | Sequence[Identity],
        settings: LimiterSettings,
    ) -> None:
        self.parent = parent
        self.function = parent.rule.policies
        self.backend = backend
        self.default_identity = default_identity
        self.settings = settings
        self.built: collections.OrderedDict[Hashable, BoundRule] = collections.OrderedDict()
        self.clock: Clock = settings.clock or MonotonicClock()
        self.logged_at: float | None = None
        self.failures = 0  # bad answers since the last log

    async def resolve(self, scope: Scope) -> BoundRule | Decision:
        """The rule for this request's policies, or the failure-mode decision."""
        try:
            answer = self.function(scope)  # type: ignore[operator]
            if inspect.isawaitable(answer):
                answer = await answer
            key = _hashable(answer)
            bound = self.built.get(key)
            if bound is not None:
                self.built.move_to_end(key)
                return bound
            bound = self._build(answer)
        except Exception as exc:
            # The function is user code on every request: its bug must not become a 500.
            self._log(exc)
            return self._fallback()
        self.built[key] = bound
        if len(self.built) > CACHED_ANSWERS:
            self.built.popitem(last=False)
        return bound

    def _build(self, answer: object) -> BoundRule:
        parent = self.parent
        problem = "no policies" if callable(answer) else None
        try:
            if problem is None:
                rule = dataclasses.replace(parent.rule, policies=answer)  # type: ignore[arg-type]
                bound = BoundRule(rule, self.backend, self.default_identity, self.settings)
                problem = None if rule.named_policies() else "no policies"
        except (TypeError, ValueError) as exc:
            problem = str(exc)
        if problem is not None:
            raise TypeError(
                f"the policies function of rule {parent.name!r} returned {answer!r}, "
                f"not policies (a policy, a list, or a mapping of names to policies): {problem}"
            )
        # Read now, not at construction: the decorator may have made it unique.
        bound.prefix = parent.prefix
        return bound

    def _fallback(self) -> Decision:
        deny = self.parent.rule.fail == "closed"
        return Decision(
            allowed=not deny,
            limit=0,
            remaining=0,
            reset_after=0.0,
            retry_after=self.settings.retry_on_error if deny else 0.0,
            policy=_NO_POLICY,
            source=Source.FAILED_CLOSED if deny else Source.FAILED_OPEN,
        )

    def _log(self, exc: Exception) -> None:
        self.failures += 1
        now = self.clock()
        if self.logged_at is not None and now - self.logged_at < LOG_EVERY:
            return
        mode = "closed" if self.parent.rule.fail == "closed" else "open"
        log.error(
            "rate limit %r: no policies for this request, failing %s "
            "(%d bad answer(s) since the last report): %s",
            self.parent.name, mode, self.failures, exc,
            exc_info=not isinstance(exc, TypeError),
        )  # fmt: skip
        self.logged_at, self.failures = now, 0
