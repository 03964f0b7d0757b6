"""``WebSocketRateLimitMiddleware``: limits on what WebSocket connections receive (pure ASGI).

A handshake that a rule applies to takes the rules' concurrency slots (a refusal
is the 429 denial response, or a close before accepting: the server's 403), then
the app runs behind a ``_Connection``, which charges each ``websocket.receive``
before handing it on, so a message over the limit never reaches the app. HTTP
and other scopes pass straight through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from headway._errors import ConcurrencyLimitExceeded, LockLost
from headway._http import ASGIApp, Message, Receive, Scope, Send, send_response
from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.backends.memory import MemoryRateLimitBackend
from headway.ratelimit.http.headers import Refusal, refusal_for
from headway.ratelimit.http.identity import ClientAddress, Identity
from headway.ratelimit.http.routes import RouteCache, RouteFunction
from headway.ratelimit.http.rules import LimiterSettings
from headway.ratelimit.http.websocket_rules import (
    POLICY_VIOLATION,
    TRY_AGAIN_LATER,
    BoundWebSocketRule,
    Closing,
    WebSocketRule,
)

__all__ = ["WebSocketRateLimitMiddleware"]

log = logging.getLogger("headway.ratelimit")

#: The rules that apply to one connection, each with the connection's key under it.
Charges = Sequence[tuple[BoundWebSocketRule, str]]


class WebSocketRateLimitMiddleware:
    """Limit the messages each WebSocket connection receives, and connections per identity.

    Every ``websocket.receive`` message is charged to the rules that apply to its
    connection before the app sees it (``WebSocketRule.unit``: per message or per
    byte). Over a limit the message is never delivered: the connection is closed
    with 1008 (policy violation) at once, or once the message has waited
    ``WebSocketRule.max_wait`` in vain (``over="wait"``); the app's next ``receive``
    gets ``websocket.disconnect`` with that code, and its sends after it fail as on
    any closed connection (an ``OSError``: Starlette's ``WebSocketDisconnect``). A
    ``Concurrency`` policy holds one slot per connection, released as soon as the
    connection closes, whoever closes it, or the app ends. A rule that fails closed
    while the backend is down closes the connection with 1013 (try again later).
    Connection attempts per second are the HTTP middleware's: ``RateLimitMiddleware``
    with ``websocket=True``.

    Args:
        app: The ASGI app behind the middleware.
        rules: The ``WebSocketRule`` list, each with a unique ``name``; every rule that
            applies to a connection is charged for each message, in order.
        backend: Where the quotas and slots live; default None: a new
            ``MemoryRateLimitBackend``, for this process only.
        identity: The rules' default identity (a rule's own comes first); a list tries
            each in turn. Default None: ``ClientAddress()``, the socket peer's address
            unless you trust proxies explicitly.
        route: How a connection's route template is found, as ``RateLimitMiddleware``'s
            ``route``; default None: the app's router (Starlette, FastAPI).
        limiter: Each rule's limiter settings (``LimiterSettings``: budget, retry on
            error, blocked-key cache, clock); default None: ``LimiterSettings()``.

    Raises:
        TypeError: ``rules`` is one ``WebSocketRule``, not a list.
        ValueError: Two rules share a name.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        rules: Sequence[WebSocketRule],
        backend: RateLimitBackend | None = None,
        identity: Identity | Sequence[Identity] | None = None,
        route: RouteFunction | None = None,
        limiter: LimiterSettings | None = None,
    ) -> None:
        if isinstance(rules, WebSocketRule):
            raise TypeError("rules takes a list of WebSocketRule, not one WebSocketRule")
        names = [r.name for r in rules]
        if len(set(names)) != len(names):
            raise ValueError(f"rule names must be unique (they name quotas): {names!r}")
        self.app = app
        backend = backend or MemoryRateLimitBackend()
        default = identity if identity is not None else ClientAddress()
        settings = limiter or LimiterSettings()
        self.rules = [BoundWebSocketRule(r, backend, default, settings) for r in rules]
        self.route = route or RouteCache(app)
        self.reads_route = any(r.bound.reads_route for r in self.rules)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        charges = await self._charges(scope)
        if not charges:
            await self.app(scope, receive, send)
            return
        slots = contextlib.AsyncExitStack()
        connection: _Connection | None = None
        try:
            try:
                refusal = await _take_slots(charges, slots)
                if refusal is not None:
                    await _deny(refusal, scope, receive, send)
                    return
                # Slots must be freed when the client leaves, even if the app is not reading.
                relay = any(rule.bound.concurrency is not None for rule, _ in charges)
                connection = _Connection(receive, send, charges, slots, relay)
                try:
                    await self.app(scope, connection.receive, connection.send)
                finally:
                    await connection.stop()
            finally:  # the app returned or raised: free its slots
                await slots.aclose()
        except LockLost:
            if connection is None:
                raise
            await connection.slot_lost()

    async def _charges(self, scope: Scope) -> list[tuple[BoundWebSocketRule, str]]:
        """The rules that apply to this connection, with its key under each."""
        route = self.route(scope) if self.reads_route else None
        path: str = scope.get("path", "")
        found = []
        for rule in self.rules:
            bound = rule.bound
            if not bound.applies("GET", route, path):  # no methods: routes alone decide
                continue
            identity = await bound.identify(scope)
            if identity is not None:
                found.append((rule, bound.key(identity, route, path)))
        return found


async def _take_slots(charges: Charges, slots: contextlib.AsyncExitStack) -> Refusal | None:
    """Hold a slot under each rule with a concurrency limit; the refusal if one has none free."""
    for rule, key in charges:
        limiter = rule.bound.concurrency
        if limiter is None:
            continue
        try:
            await slots.enter_async_context(limiter.hold(key))
        except ConcurrencyLimitExceeded as exc:
            return refusal_for(rule.bound, exc.admission, [(rule.bound, exc.admission)], False)
    return None


async def _deny(refusal: Refusal, scope: Scope, receive: Receive, send: Send) -> None:
    """Refuse a handshake: the 429 (or 503) itself if the server can send it, else a 403."""
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        await send_response(send, *refusal, websocket=True)
    else:  # closing before accepting makes the server answer 403
        await send({"type": "websocket.close", "code": POLICY_VIOLATION, "reason": "rate limited"})


@dataclass(frozen=True, slots=True)
class _Failed:
    """The server's ``receive`` (or a charge) raised: the app's ``receive`` raises it too."""

    error: Exception


class _ClosedByRateLimit(OSError):
    """A send on a connection the rate limit closed (an ``OSError``, as the ASGI spec asks)."""


class _Connection:
    """One connection's ``receive`` and ``send``, as the app sees them.

    Each received message is charged before the app gets it (``_next``). A
    connection holding concurrency slots must free them as soon as its client
    leaves, even while the app is not reading (a push-only handler): there a
    relay task reads the server's messages one at a time and hands them on
    through a queue of one, so the app never lags more than one message behind,
    nothing piles up in memory, and the departure is seen unless a message is
    already waiting for the app. Without slots the app's own ``receive`` reads
    and charges (no task, no hop). Sends are serialized with the limit's close,
    so no send can follow it.
    """

    def __init__(
        self,
        receive: Receive,
        send: Send,
        charges: Charges,
        slots: contextlib.AsyncExitStack,
        relay: bool,
    ) -> None:
        self.server_receive = receive
        self.server_send = send
        self.charges = charges
        self.slots = slots
        self.queue: asyncio.Queue[Message | _Failed] = asyncio.Queue(maxsize=1)
        self.final: Message | None = None  # the disconnect, once relayed
        self.failure: Exception | None = None  # what the server's receive raised
        self.sending = asyncio.Lock()
        self.accepted = False
        self.closed = False  # a close (or a denial response) was sent
        self.limited = False  # ...by the rate limit
        self.pump: asyncio.Task[None] | None = None
        if relay:
            self.pump = asyncio.get_running_loop().create_task(self._relay())

    async def _next(self) -> Message:
        """The server's next message, charged: over a limit, the disconnect instead."""
        message = await self.server_receive()
        if message["type"] == "websocket.receive":
            closing = await self._admit(message)
            if closing is not None:
                return await self._close(closing)
        return message

    async def _relay(self) -> None:
        try:
            while True:
                message = await self._next()
                if message["type"] == "websocket.disconnect":
                    await self._release()
                    self.final = message
                await self.queue.put(message)
                if self.final is not None:
                    return
        except Exception as exc:  # the server's receive failed: so does the app's
            await self.queue.put(_Failed(exc))

    async def _admit(self, message: Message) -> Closing | None:
        for rule, key in self.charges:
            closing = await rule.admit(key, message)
            if closing is not None:
                return closing
        return None

    async def _close(self, closing: Closing) -> Message:
        """Close the connection for ``closing``; the disconnect the app gets instead."""
        code, reason = closing
        async with self.sending:
            if not self.closed:
                self.closed = self.limited = True
                log.info("WebSocket closed by its rate limit: %d %s", code, reason)
                closing_message = {"type": "websocket.close", "code": code, "reason": reason}
                with contextlib.suppress(OSError):  # the client is gone already
                    await self.server_send(closing_message)
        return {"type": "websocket.disconnect", "code": code, "reason": reason}

    async def _release(self) -> None:
        # A slot whose lease lapsed is free already: nothing is left to give back.
        with contextlib.suppress(LockLost):
            await self.slots.aclose()

    async def receive(self) -> Message:
        """The next message the app may see."""
        if self.pump is None:  # no relay: read and charge here
            if self.final is None:
                received = await self._next()
                if received["type"] != "websocket.disconnect":
                    return received
                self.final = received
            return self.final
        if self.queue.empty():  # every call after the end gets the end again
            if self.final is not None:
                return self.final
            if self.failure is not None:
                raise self.failure
        message = await self.queue.get()
        if isinstance(message, _Failed):
            self.failure = message.error
            raise message.error
        return message

    async def send(self, message: Message) -> None:
        """Send for the app, unless the rate limit closed the connection."""
        kind = message["type"]
        async with self.sending:
            if self.limited:
                if kind == "websocket.close":
                    return  # closed already
                raise _ClosedByRateLimit("the rate limit closed this WebSocket connection")
            await self.server_send(message)
            if kind == "websocket.accept":
                self.accepted = True
            ended = kind == "websocket.close" or (
                kind == "websocket.http.response.body" and not message.get("more_body", False)
            )
            self.closed = self.closed or ended
        if ended:
            await self._release()

    async def stop(self) -> None:
        """Stop relaying (the app is done)."""
        if self.pump is None:
            return
        if not self.pump.done():
            self.pump.cancel()
        await asyncio.wait([self.pump])

    async def slot_lost(self) -> None:
        """The app was cancelled because a slot's lease was lost: close (1013 once accepted)."""
        log.warning("a WebSocket connection lost its concurrency slot: closed")
        async with self.sending:
            if self.closed:
                return
            self.closed = True
            code = TRY_AGAIN_LATER if self.accepted else POLICY_VIOLATION
            with contextlib.suppress(OSError):
                await self.server_send({"type": "websocket.close", "code": code})
