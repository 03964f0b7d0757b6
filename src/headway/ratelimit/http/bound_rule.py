"""``BoundRule``: a ``Rule`` bound to a backend, as the guard runs it on each request.

It owns the rule's limiters (a ``RateLimiter`` for its rate policies, a
``ConcurrencyLimiter`` for its in-flight limit, configured by ``LimiterSettings``),
its serialized header items, and the per-request steps: whether it applies, whose
quota (the identity), at what cost, under which key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from headway._http import Scope
from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.concurrency import ConcurrencyLimiter
from headway.ratelimit.http.headers import concurrency_item, policy_item, sf_string
from headway.ratelimit.http.identity import ApiKey, AuthenticatedUser, ClientAddress, Identity
from headway.ratelimit.http.rules import LimiterSettings, Rule, matches_any, split_limits
from headway.ratelimit.limiter import RateLimiter
from headway.ratelimit.policies import Concurrency, OnError, Policy

if TYPE_CHECKING:  # the guard binds them; they build BoundRules: no import cycle at run time
    from headway.ratelimit.http.dynamic import DynamicPolicies

__all__ = ["BoundRule"]

#: Identities that answer at once with a str or None (exact types: a subclass may not).
_SYNC_IDENTITIES = (ClientAddress, ApiKey, AuthenticatedUser)


async def _resolve(value: object) -> object:
    return await value if inspect.isawaitable(value) else value


def _failing_as_told(rule: Rule) -> tuple[dict[str, Policy], dict[str, Concurrency]]:
    """The rule's rate policies and in-flight limits by name, ``rule.fail`` applied."""
    rates, slots = split_limits(rule.named_policies())
    if rule.fail is not None:
        on_error: OnError = "allow" if rule.fail == "open" else "deny"
        rates = {n: dataclasses.replace(p, on_error=on_error) for n, p in rates.items()}
        slots = {n: dataclasses.replace(p, on_error=on_error) for n, p in slots.items()}
    return rates, slots


def _rate_limiter(
    rule: Rule, rates: dict[str, Policy], backend: RateLimitBackend, settings: LimiterSettings
) -> RateLimiter | None:
    """The limiter of the rule's rate policies (None without any), metering as told."""
    if not rates:
        return None
    metered = None
    if rule.metering is not None and rule.metering.policies is not None:
        metered = [rates[n] for n in rule.metering.policies]
    return settings.rate_limiter(list(rates.values()), backend, rule.lease, metered)


def _identities(identity: Identity | Sequence[Identity]) -> tuple[Identity, ...]:
    """One identity, or a list of them tried in turn, as a tuple."""
    return tuple(identity) if isinstance(identity, Sequence) else (identity,)


def _sync_identity(identities: tuple[Identity, ...]) -> Callable[[Scope], str | None] | None:
    """The one identity when it answers at once (the guard then calls it directly)."""
    if len(identities) == 1 and type(identities[0]) in _SYNC_IDENTITIES:
        return cast(Callable[[Scope], "str | None"], identities[0])
    return None


class BoundRule:
    """A rule on a backend: its limiter, header items, and request matching.

    Args:
        rule: The rule.
        backend: Where its quotas (and slots) live.
        default_identity: Whose quota, when the rule names no identity of its own.
        settings: How its limiters call the backend.
    """

    def __init__(
        self,
        rule: Rule,
        backend: RateLimitBackend,
        default_identity: Identity | Sequence[Identity],
        settings: LimiterSettings,
    ) -> None:
        rates, slots = _failing_as_told(rule)
        self.rule = rule
        self.name = rule.name
        #: What keys start with: the name, unless the decorator makes it unique per endpoint.
        self.prefix = rule.name
        self.names = list(rates)
        self.metering = rule.metering
        self.limiter = _rate_limiter(rule, rates, backend, settings)
        self.header_names = [sf_string(n) for n in self.names]
        self.policy_items = [policy_item(n, p) for n, p in rates.items()]
        self.concurrency: ConcurrencyLimiter | None = None
        self.slot_name = self.slot_header = ""
        for name, policy in slots.items():
            self.concurrency = settings.concurrency_limiter(policy, backend)
            self.slot_name, self.slot_header = name, sf_string(name)
            self.policy_items.append(concurrency_item(name, policy.limit))
        #: The ``RateLimit-Policy`` items, serialized once (they never change).
        self.policy_field = ", ".join(self.policy_items).encode()
        self.methods = frozenset(m.upper() for m in rule.methods)
        self.identities = _identities(
            rule.identity if rule.identity is not None else default_identity
        )
        #: The rule's one identity when it answers at once (the guard then calls it directly).
        self.sync_identity = _sync_identity(self.identities)
        #: The cost when it is a constant (no function to call).
        self.fixed_cost = rule.cost if isinstance(rule.cost, int) else None
        self.shadow = rule.shadow
        #: Whether deciding reads the route template (patterns, or a quota per route).
        self.reads_route = bool(rule.routes or rule.exempt or rule.per == "route")
        #: Resolves a dynamic rule's policies per request (set by the guard), else None.
        self.dynamic: DynamicPolicies | None = None

    def applies(self, method: str, route: str | None, path: str) -> bool:
        """Whether the rule guards this request (``route`` is the template, if known)."""
        if self.methods and method not in self.methods:
            return False
        subject = route if route is not None else path
        rule = self.rule
        if rule.routes and not matches_any(rule.routes, subject):
            return False
        return not (rule.exempt and matches_any(rule.exempt, subject))

    async def identify(self, scope: Scope) -> str | None:
        """The first identity that applies to the request, or None."""
        for identity in self.identities:
            found = identity(scope)
            if type(found) is str:
                return found
            if found is None:
                continue
            value = await _resolve(found)
            if value is not None:
                if not isinstance(value, str):
                    raise TypeError(f"identity {identity!r} returned {value!r}, not a str")
                return value
        return None

    async def cost(self, scope: Scope) -> int:
        """The units this request costs."""
        cost = self.rule.cost
        if isinstance(cost, int):
            return cost
        value = await _resolve(cost(scope))
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"cost function {cost!r} returned {value!r}, not an int")
        return value

    def key(self, identity: str, route: str | None, path: str) -> str:
        """The limiter key: rule name, then (per route or path) a digest, then the identity.

        The name and the digest hold no ``/``, so two different requests can
        never produce the same key, whatever the identity contains.
        """
        if self.rule.per == "rule":
            return f"{self.prefix}/{identity}"
        where = (route if route is not None else "-") if self.rule.per == "route" else path
        digest = hashlib.blake2b(where.encode("utf-8", "surrogatepass"), digest_size=8)
        return f"{self.prefix}/{digest.hexdigest()}/{identity}"
