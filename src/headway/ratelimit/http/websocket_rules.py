"""``WebSocketRule``: limits on the messages a WebSocket connection receives, per identity.

A WebSocket rule is an HTTP ``Rule`` with one more question answered: what a
received message costs. It is bound as one (``BoundRule``), so its identities,
keys, limiter and concurrency slots are the HTTP rules' own; ``BoundWebSocketRule``
adds only the charging of one message (``admit``): its cost (1, or its payload's
size), then a hit, or a bounded wait, on the rule's limiter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from headway._http import Message
from headway.ratelimit.arguments import check_seconds
from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.http.bound_rule import BoundRule
from headway.ratelimit.http.identity import Identity
from headway.ratelimit.http.rules import LimiterSettings, Limits, Pattern, Per, Rule
from headway.ratelimit.leasing import Leasing

__all__ = ["POLICY_VIOLATION", "TRY_AGAIN_LATER", "BoundWebSocketRule", "Closing", "WebSocketRule"]

#: RFC 6455's close code for a message that violates the server's policy: over a limit.
POLICY_VIOLATION = 1008
#: RFC 6455's close code for a temporary condition: the limit could not be checked.
TRY_AGAIN_LATER = 1013

#: Why a connection is closed: its close code and reason.
Closing = tuple[int, str]

_OVER = (POLICY_VIOLATION, "rate limited")
_TOO_LARGE = (POLICY_VIOLATION, "message larger than the rate limit")
_UNCHECKED = (TRY_AGAIN_LATER, "rate limit unavailable")


@dataclass(frozen=True, slots=True)
class WebSocketRule:
    """Rate policies charged for each message a WebSocket connection receives.

    Args:
        policies: One policy, several (checked together, all-or-nothing), or a mapping
            naming each one. One of them may be a ``Concurrency`` limit: each
            connection then holds a slot from its handshake until it closes, however
            it closes; a handshake finding none free is refused (429).
        unit: What the rate policies count: ``"message"`` (each received message
            costs 1; default) or ``"byte"`` (a message costs its payload's size: binary
            as received, text encoded as UTF-8; an empty message costs nothing).
        over: What a message over the limit does: ``"close"`` (default) closes the
            connection with 1008 (policy violation) without delivering it; ``"wait"``
            holds it until admitted, at most ``max_wait`` seconds, then closes the
            same way. Later messages wait behind it, in order.
        max_wait: The longest a message waits with ``over="wait"``, in seconds (finite,
            >= 0); default 1.0.
        routes: Route templates, globs or regexes, as ``Rule.routes``; empty (default)
            means every WebSocket route.
        exempt: Routes left out, in the syntax of ``routes``; default none.
        identity: Whose quota is charged; default None: the middleware's. A list tries
            each in turn; an identity returning None skips the rule.
        name: The rule's name, as ``Rule.name``: it starts the keys (a WebSocket rule and
            an HTTP rule of one name, with one policy, share its quota); default
            ``"websocket"``.
        per: One quota per identity for the whole rule (``"rule"``, default), per route
            template (``"route"``), or per concrete path (``"path"``).
        fail: ``"open"`` or ``"closed"`` when the backend errs or is too slow (closed:
            the connection is closed with 1013, try again later); default None: each
            policy's ``on_error``.
        lease: Take the quota from the backend in chunks and decide in process
            (``Leasing``), as ``Rule.lease``: for high message rates. Default None.

    Raises:
        TypeError: A policies function (a WebSocket rule's policies are fixed), or an
            option of the wrong type.
        ValueError: A bad ``unit``, ``over`` or ``max_wait``, or what ``Rule`` refuses.
    """

    policies: Limits
    unit: Literal["message", "byte"] = "message"
    over: Literal["close", "wait"] = "close"
    max_wait: float = 1.0
    routes: Sequence[Pattern] = ()
    exempt: Sequence[Pattern] = ()
    identity: Identity | Sequence[Identity] | None = None
    name: str = "websocket"
    per: Per = "rule"
    fail: Literal["open", "closed"] | None = None
    lease: Leasing | None = None

    def __post_init__(self) -> None:
        if callable(self.policies):
            raise TypeError("WebSocketRule.policies takes policies, not a function of the scope")
        if self.unit not in ("message", "byte"):
            raise ValueError(f"WebSocketRule.unit must be 'message' or 'byte', got {self.unit!r}")
        if self.over not in ("close", "wait"):
            raise ValueError(f"WebSocketRule.over must be 'close' or 'wait', got {self.over!r}")
        check_seconds("max_wait", self.max_wait)
        self.as_rule()  # the HTTP rule's checks: policies, patterns, name, per, fail, lease

    def as_rule(self) -> Rule:
        """The HTTP ``Rule`` this rule is bound as (its identities, keys, limiter, slots)."""
        return Rule(
            self.policies,
            routes=self.routes,
            exempt=self.exempt,
            identity=self.identity,
            name=self.name,
            per=self.per,
            fail=self.fail,
            lease=self.lease,
        )


def payload_size(message: Message) -> int:
    """A ``websocket.receive`` message's payload size in bytes (text as UTF-8)."""
    data = message.get("bytes")
    if data is not None:
        return len(data)
    text = message.get("text")
    return 0 if text is None else len(text.encode("utf-8", "surrogatepass"))


class BoundWebSocketRule:
    """A WebSocket rule on a backend: its ``BoundRule``, and what a message costs.

    Args:
        rule: The rule.
        backend: Where its quotas and slots live.
        default_identity: The middleware's identity, for a rule without its own.
        settings: Its limiter's settings.
    """

    def __init__(
        self,
        rule: WebSocketRule,
        backend: RateLimitBackend,
        default_identity: Identity | Sequence[Identity],
        settings: LimiterSettings,
    ) -> None:
        self.rule = rule
        self.bound = BoundRule(rule.as_rule(), backend, default_identity, settings)
        self.by_size = rule.unit == "byte"
        self.waits = rule.over == "wait"
        limiter = self.bound.limiter
        #: The largest cost any message may have: more can never be admitted.
        self.largest = 0 if limiter is None else min(p.limit for p in limiter.policies)

    async def admit(self, key: str, message: Message) -> Closing | None:
        """Charge one received message to ``key``; None if admitted, else why to close.

        Args:
            key: The connection's key under this rule (``BoundRule.key``).
            message: The ``websocket.receive`` message.
        """
        limiter = self.bound.limiter
        if limiter is None:  # a rule of connections alone
            return None
        cost = payload_size(message) if self.by_size else 1
        if cost == 0:
            return None
        if cost > self.largest:
            return _TOO_LARGE
        if self.waits:
            decision = await limiter.wait(key, cost, timeout=self.rule.max_wait)
        else:
            decision = await limiter.hit(key, cost)
        if decision.allowed:
            return None
        return _UNCHECKED if decision.failed else _OVER
