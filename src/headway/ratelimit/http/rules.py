"""``Rule``: which requests a set of policies guards, whose quota they charge, at what cost.

A rule is a plain value; the guard binds it to a backend as a ``BoundRule``
(``bound_rule.py``), which owns the rule's ``RateLimiter`` (configured by
``LimiterSettings``), its serialized header items, and decides whether it applies to a
request.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from headway._clock import Clock
from headway._http import Scope
from headway.ratelimit.arguments import check_policies
from headway.ratelimit.backends.contract import ConcurrencyBackend, RateLimitBackend
from headway.ratelimit.concurrency import ConcurrencyLimiter
from headway.ratelimit.decision import Decision
from headway.ratelimit.http.identity import Identity
from headway.ratelimit.http.metering import Metering
from headway.ratelimit.leasing import Leasing, check_leasable
from headway.ratelimit.limiter import RateLimiter
from headway.ratelimit.policies import Concurrency, Policy
from headway.ratelimit.slots import Admission

__all__ = [
    "CostFunction",
    "Limit",
    "LimiterSettings",
    "Pattern",
    "PolicyFunction",
    "Rule",
    "RuleAnswer",
    "given_policies",
    "matches_any",
    "split_limits",
    "validated_patterns",
]

CostFunction = Callable[[Scope], "int | Awaitable[int]"]
Pattern = str | re.Pattern[str]
Per = Literal["rule", "route", "path"]
#: What a rule may hold: rate policies, and at most one in-flight limit.
Limit = Policy | Concurrency
#: What a rule answers for a request: a rate ``Decision``, or an in-flight limit's ``Admission``.
RuleAnswer = Decision | Admission
#: What a rule's ``policies`` function returns: what ``Rule.policies`` takes.
Limits = Limit | Sequence[Limit] | Mapping[str, Limit]
PolicyFunction = Callable[[Scope], "Limits | Awaitable[Limits]"]
"""Policies chosen per request (tiers): a function of the scope, sync or async, returning
what ``Rule.policies`` takes (a policy, several, or a mapping naming them)."""

_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def validated_patterns(field: str, patterns: Sequence[Pattern]) -> tuple[Pattern, ...]:
    """``patterns`` as a tuple, or TypeError naming ``field`` if one is not a pattern."""
    if isinstance(patterns, str | re.Pattern):
        raise TypeError(f"Rule.{field} takes a list of patterns, not one pattern")
    for pattern in patterns:
        if not isinstance(pattern, str | re.Pattern):
            raise TypeError(f"Rule.{field}: not a template or a pattern: {pattern!r}")
    return tuple(patterns)


def given_policies(
    policies: Sequence[Limit | PolicyFunction], named: Mapping[str, Limit] | None
) -> Limits | PolicyFunction:
    """A rule's ``policies``, from positional or ``named`` ones (decorator, dependency)."""
    if named is not None:
        if policies:
            raise TypeError("give policies or named policies, not both")
        return named
    if len(policies) == 1 and callable(policies[0]):
        return policies[0]
    if any(callable(p) for p in policies):
        raise TypeError("a policies function comes alone, without other policies")
    return cast(Sequence[Limit], policies)


def matches_any(patterns: Sequence[Pattern], subject: str) -> bool:
    """Whether a template, a glob on templates or a regex (searched) matches ``subject``."""
    for pattern in patterns:
        if isinstance(pattern, re.Pattern):
            if pattern.search(subject):
                return True
        elif "*" in pattern:
            if fnmatch.fnmatchcase(subject, pattern):
                return True
        elif pattern == subject:
            return True
    return False


@dataclass(frozen=True, slots=True)
class Rule:
    """Policies guarding the requests that match ``routes`` and ``methods``.

    Args:
        policies: One policy, several (checked together, all-or-nothing), or a
            mapping naming each one in the headers (default names: the rule's
            ``name``, or ``name-1``, ``name-2``... for several). One of them may be a
            ``Concurrency`` limit: the request then holds a slot while it runs,
            released when its response ends, its client leaves or the app raises.
            Or a function of the scope (sync or async) returning any of these per
            request (tiers: see ``headway.ratelimit.http.dynamic``).
        routes: Route templates (``"/users/{id}"``), glob patterns on templates
            (``"/admin/*"``) or compiled regexes searched in the raw path; empty
            (default) means every request. Templates come from the app's router, so
            ``/users/1`` and ``/users/2`` match the same rule.
        methods: HTTP methods guarded; empty (default) means all.
        exempt: Routes left out, in the syntax of ``routes``; default none.
        cost: Units per request (default 1), or a function of the scope (sync or
            async) returning them.
        identity: Whose quota is charged; default None: the middleware's. A list
            tries each in turn; an identity returning None skips the rule.
        name: The rule's name, 1-64 letters, digits, ``_``, ``.`` or ``-``: it starts
            the keys and names the policies in the headers; default ``"default"``.
        per: One quota per identity for the whole rule (``"rule"``, default), per
            route template (``"route"``), or per concrete path (``"path"``).
        fail: ``"open"`` or ``"closed"`` when the backend errs or is too slow;
            default None: each policy's ``on_error``.
        shadow: Decide, log, report and set headers, but never reject; default False.
        lease: Take the quota from the backend in chunks and decide in process
            (``Leasing``; exact, see docs/ratelimit.md); not for sliding logs. Default
            None: every request asks the backend.
        metering: Reserve an estimate per request and settle the actual cost when the
            response ends (``Metering``: tokens per minute; docs/ratelimit.md, "Metered
            costs"); ``cost`` is then not used. Not with a policies function. Default
            None.

    Raises:
        TypeError: A pattern, a cost or a policy of the wrong type.
        ValueError: A bad ``name``, ``per`` or ``fail``, more than one ``Concurrency``,
            policies that cannot go together (or be leased), or metering that names no
            rate policy of the rule.
    """

    policies: Limits | PolicyFunction
    routes: Sequence[Pattern] = ()
    methods: Collection[str] = ()
    exempt: Sequence[Pattern] = ()
    cost: int | CostFunction = 1
    identity: Identity | Sequence[Identity] | None = None
    name: str = "default"
    per: Per = "rule"
    fail: Literal["open", "closed"] | None = None
    shadow: bool = False
    lease: Leasing | None = None
    metering: Metering | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"Rule.name must be 1-64 letters, digits, '_', '.' or '-', got {self.name!r}"
            )
        validated_patterns("routes", self.routes)
        validated_patterns("exempt", self.exempt)
        if self.per not in ("rule", "route", "path"):
            raise ValueError(f"Rule.per must be 'rule', 'route' or 'path', got {self.per!r}")
        if self.fail not in (None, "open", "closed"):
            raise ValueError(f"Rule.fail must be 'open', 'closed' or None, got {self.fail!r}")
        if isinstance(self.cost, bool) or not (isinstance(self.cost, int) or callable(self.cost)):
            raise TypeError(f"Rule.cost must be an int or a function, got {self.cost!r}")
        if self.metering is not None and not isinstance(self.metering, Metering):
            raise TypeError(f"Rule.metering must be a Metering, got {self.metering!r}")
        if self.dynamic:
            if self.metering is not None:
                raise ValueError("Rule.metering needs the rule's policies, not a function")
            return  # checked on each answer of the function
        rates, slots = split_limits(self.named_policies())
        if self.metering is not None:
            _check_metered(self.metering, rates)
        if len(slots) > 1:
            raise ValueError("a rule holds at most one Concurrency limit")
        if rates or not slots:
            checked = check_policies(list(rates.values()))
            if self.lease is not None:
                check_leasable(checked)

    @property
    def dynamic(self) -> bool:
        """Whether ``policies`` is a function of the request."""
        return callable(self.policies)

    def named_policies(self) -> dict[str, Limit]:
        """The rule's policies by the name the headers give them (none when dynamic)."""
        policies = self.policies
        if callable(policies):
            return {}
        if isinstance(policies, Mapping):
            return dict(policies)
        if not isinstance(policies, Sequence):
            return {self.name: policies}
        if len(policies) == 1:
            return {self.name: policies[0]}
        return {f"{self.name}-{i}": p for i, p in enumerate(policies, 1)}


@dataclass(frozen=True, slots=True)
class LimiterSettings:
    """How each rule's limiter calls the backend (the middleware's and decorator's ``limiter``).

    Args:
        budget: Seconds a decision may take before the rule fails open or closed;
            default 0.25.
        retry_on_error: The ``Retry-After`` (seconds) of a decision the backend failed;
            default 1.0.
        cache_blocked: Remember rejections in process until they expire (True, or the
            number of keys to remember), as ``RateLimiter(cache_blocked=...)``; default
            False.
        clock: The monotonic clock of budgets, the blocked-key cache and the outage log;
            default None: ``time.monotonic`` (tests inject a ``FakeClock``).
    """

    budget: float = 0.25
    retry_on_error: float = 1.0
    cache_blocked: bool | int = False
    clock: Clock | None = None

    def rate_limiter(
        self,
        policies: Sequence[Policy],
        backend: RateLimitBackend,
        lease: Leasing | None = None,
        metered: Sequence[Policy] | None = None,
    ) -> RateLimiter:
        """A ``RateLimiter`` with these settings.

        Args:
            policies: Its rate policies.
            backend: The backend it decides on.
            lease: Its ``Leasing``, if any; default None.
            metered: The policies its reservations meter; default None: all.
        """
        return RateLimiter(
            *policies,
            backend=backend,
            budget=self.budget,
            retry_on_error=self.retry_on_error,
            cache_blocked=self.cache_blocked,
            clock=self.clock,
            lease=lease,
            metered=metered,
        )

    def concurrency_limiter(
        self, policy: Concurrency, backend: RateLimitBackend
    ) -> ConcurrencyLimiter:
        """A ``ConcurrencyLimiter`` with these settings.

        Args:
            policy: Its in-flight limit.
            backend: The backend holding the slots (it must have ``acquire_slot``).

        Raises:
            TypeError: ``backend`` cannot hold concurrency slots.
        """
        if not hasattr(backend, "acquire_slot"):
            raise TypeError(f"backend {backend!r} cannot hold concurrency slots")
        return ConcurrencyLimiter(
            policy,
            backend=cast(ConcurrencyBackend, backend),
            budget=self.budget,
            retry_on_error=self.retry_on_error,
            clock=self.clock,
        )


def _check_metered(metering: Metering, rates: Mapping[str, Policy]) -> None:
    if not rates:
        raise ValueError("Rule.metering needs a rate policy (a Concurrency limit is not metered)")
    unknown = [n for n in metering.policies or () if n not in rates]
    if unknown:
        raise ValueError(f"Metering.policies names no rate policy of the rule: {unknown!r}")


def split_limits(named: dict[str, Limit]) -> tuple[dict[str, Policy], dict[str, Concurrency]]:
    """A rule's named limits split into its rate policies and its in-flight limits."""
    rates = {n: p for n, p in named.items() if not isinstance(p, Concurrency)}
    slots = {n: p for n, p in named.items() if isinstance(p, Concurrency)}
    return rates, slots
