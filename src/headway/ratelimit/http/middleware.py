"""``RateLimitMiddleware``: rate-limit rules in front of any ASGI app (pure ASGI).

The middleware asks its ``Guard`` once per request and sends what it ruled:
the app's response with the RateLimit fields added, or the refusal. A metered rule's
reservations settle when the response ends (``metering``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Sequence

from starlette.responses import Response

from headway._errors import LockLost
from headway._http import ASGIApp, Message, Receive, Scope, Send, send_response
from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.http.guard import Guard
from headway.ratelimit.http.headers import Refusal, slot_lost
from headway.ratelimit.http.identity import Identity
from headway.ratelimit.http.metering import Meter, pending_settles
from headway.ratelimit.http.refusals import RefusalHook
from headway.ratelimit.http.reporting import DecisionHook, DecisionOutcome
from headway.ratelimit.http.routes import RouteCache, RouteFunction
from headway.ratelimit.http.rules import LimiterSettings, Pattern, Rule
from headway.ratelimit.http.watch import ClientWatch
from headway.ratelimit.waiting import DEFAULT_MAX_WAITING, ClientGone

__all__ = ["RateLimitMiddleware"]


log = logging.getLogger("headway.ratelimit")


class RateLimitMiddleware:
    """Check every HTTP request against ``rules`` before the app sees it.

    A request that a rule refuses gets 429 (``application/problem+json`` of
    type ``quota-exceeded`` naming the violated policies, ``Retry-After``,
    ``Cache-Control: no-store``); one whose rule fails closed while the
    backend is down gets 503 with ``Retry-After`` (type
    ``temporary-reduced-capacity``). Every response of a limited request carries
    ``RateLimit-Policy`` and ``RateLimit`` (draft-ietf-httpapi-ratelimit-headers-11),
    plus ``X-RateLimit-*`` with ``legacy_headers``.

    Rules decide on the route template, found in the app's router (Starlette,
    FastAPI; see ``route``). Other scopes than HTTP (and WebSocket, with
    ``websocket``) pass through; the messages of a WebSocket connection are
    ``WebSocketRateLimitMiddleware``'s.

    Args:
        app: The ASGI app behind the middleware.
        rules: The ``Rule`` list, each with a unique ``name``; every rule that applies
            to a request is checked.
        backend: Where the quotas live; default None: a new ``MemoryRateLimitBackend``,
            for this process only.
        identity: The rules' default identity (a rule's own comes first); a list
            tries each in turn. Default None: ``ClientAddress()``, the socket peer's
            address unless you trust proxies explicitly.
        exempt: Routes that skip every rule (templates, globs or regexes, as
            ``Rule.routes``); default none.
        shadow: Every rule reports without refusing; default False.
        on_decision: A ``DecisionHook`` called (sync or async) with a ``RateLimitEvent``
            for every decision; default None.
        legacy_headers: Also send ``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset``;
            default False.
        websocket: Also limit WebSocket connection attempts (as GET requests); default
            False.
        route: How a request's template is found: a function of the scope returning
            it, or None when unknown (rules then match the raw path). Default None:
            the app's router (Starlette, FastAPI), cached per path.
        limiter: Each rule's limiter settings (budget, retry on error, blocked-key
            cache, clock: ``LimiterSettings``); default None: ``LimiterSettings()``.
        on_refusal: A ``RefusalHook`` shaping the 429/503 (given a ``RefusalContext``,
            it returns a Starlette ``Response``, members for the problem body, or None;
            a hook that raises is logged and the default refusal is sent); default
            None.
        max_wait: Seconds a request a rate policy refuses may wait for admission, in
            arrival order, before its 429; default 0: refused at once. A request whose
            client disconnects while it waits leaves (nothing sent, nothing charged).
        max_waiting: How many requests may wait at once (per middleware); past it a
            request that would wait is refused at once. Default 100.

    Raises:
        TypeError: ``rules`` is one ``Rule``, not a list, or ``max_wait`` or
            ``max_waiting`` of the wrong type.
        ValueError: Two rules, or two policies across rules, share a name; ``max_wait``
            negative or infinite, or ``max_waiting`` < 1.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        rules: Sequence[Rule],
        backend: RateLimitBackend | None = None,
        identity: Identity | Sequence[Identity] | None = None,
        exempt: Sequence[Pattern] = (),
        shadow: bool = False,
        on_decision: DecisionHook | None = None,
        legacy_headers: bool = False,
        websocket: bool = False,
        route: RouteFunction | None = None,
        limiter: LimiterSettings | None = None,
        on_refusal: RefusalHook | None = None,
        max_wait: float = 0.0,
        max_waiting: int = DEFAULT_MAX_WAITING,
    ) -> None:
        self.app = app
        self.websocket = websocket
        self.guard = Guard(
            rules,
            backend=backend,
            identity=identity,
            route=route or RouteCache(app),
            exempt=exempt,
            shadow=shadow,
            on_decision=on_decision,
            legacy_headers=legacy_headers,
            limiter=limiter,
            on_refusal=on_refusal,
            max_wait=max_wait,
            max_waiting=max_waiting,
        )

    @property
    def counts(self) -> collections.Counter[tuple[str, DecisionOutcome]]:
        """Decisions counted by (rule name, outcome): allowed, rejected, errored."""
        return self.guard.counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            method = scope["method"]
        elif kind == "websocket" and self.websocket:
            method = "GET"  # a WebSocket handshake is a GET request
        else:
            await self.app(scope, receive, send)
            return
        if self.guard.lines is None:
            headers, refusal, slots = await self.guard.decide(scope, method)
        else:
            watch = ClientWatch(receive)
            try:
                headers, refusal, slots = await self.guard.decide(scope, method, watch)
            except ClientGone:
                return  # the client left while its request waited: nobody to answer
            finally:
                receive = await watch.stop()  # what the watch read, then the server's
        if slots is None:  # the usual case: nothing to give back
            if refusal is not None:
                await _refuse(refusal, scope, receive, send)
            elif headers:
                await self.app(scope, receive, _with_headers(send, headers, kind))
            else:
                await self.app(scope, receive, send)
            return
        releasing = _Releasing(send, slots, pending_settles(scope))
        try:
            try:
                if refusal is not None:
                    await _refuse(refusal, scope, receive, send)
                else:
                    await self._holding(releasing, headers, scope, receive)
            finally:  # the app returned or raised: free its slots
                await slots.aclose()
        except LockLost:
            if releasing.started or kind != "http":
                raise  # the client already has part of a response: it can only be cut
            await _slot_lost(send)

    async def _holding(
        self,
        releasing: _Releasing,
        headers: Sequence[tuple[bytes, bytes]],
        scope: Scope,
        receive: Receive,
    ) -> None:
        """Run the app while the request holds concurrency slots."""
        kind = scope["type"]
        watch = _DisconnectWatch(receive, releasing.slots) if kind == "http" else None
        try:
            await self.app(scope, watch or receive, _with_headers(releasing, headers, kind))
        finally:
            if watch is not None:
                await watch.close()


def _with_headers(send: Send, extra: Sequence[tuple[bytes, bytes]], kind: str) -> Send:
    start = "http.response.start" if kind == "http" else "websocket.accept"

    # Not a coroutine: it hands back the server's awaitable (one frame less per message).
    def wrapped(message: Message) -> Awaitable[None]:
        if message["type"] == start:
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        return send(message)

    return wrapped


class _Releasing:
    """A ``send`` that frees the request's slots and settles its reservations once its
    response is complete (not after background tasks), and knows whether the response
    has started. A metered request's ``Meter`` notes the response's head and trailers."""

    __slots__ = ("meter", "send", "slots", "started")

    def __init__(self, send: Send, slots: contextlib.AsyncExitStack, meter: Meter | None) -> None:
        self.send = send
        self.slots = slots
        self.meter = meter
        self.started = False

    async def __call__(self, message: Message) -> None:
        self.started = True
        kind = message["type"]
        meter = self.meter
        if meter is not None:
            if kind == "http.response.start":
                meter.response(message["status"], message.get("headers", ()))
                # A response with trailers ends with them (they may carry the cost).
                meter.trailing = bool(message.get("trailers", False))
            elif kind == "http.response.trailers":
                meter.trailers(message.get("headers", ()))
        await self.send(message)
        if kind == "http.response.body" and not message.get("more_body", False):
            if meter is None or not meter.trailing:
                await self.slots.aclose()
        elif (kind == "http.response.trailers" and not message.get("more_trailers", False)) or (
            kind == "websocket.close"
        ):
            await self.slots.aclose()


async def _slot_lost(send: Send) -> None:
    log.warning("a request lost its concurrency slot before responding: cancelled")
    await send_response(send, *slot_lost())


class _DisconnectWatch:
    """A ``receive`` that frees the request's slots as soon as its client is gone.

    A task relays the server's messages to the app one at a time (a queue of
    one: no read-ahead beyond a single body chunk), so a departure is seen
    even while the handler never calls ``receive``; the app gets every
    message, and ``http.disconnect`` again on every call after the last.
    """

    def __init__(self, receive: Receive, slots: contextlib.AsyncExitStack) -> None:
        self.receive = receive
        self.slots = slots
        self.queue: asyncio.Queue[Message] = asyncio.Queue(maxsize=1)
        self.final: Message | None = None
        self.pump = asyncio.get_running_loop().create_task(self._relay())

    async def _relay(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                await self.slots.aclose()
                self.final = message
            await self.queue.put(message)
            if self.final is not None:
                return

    async def __call__(self) -> Message:
        if self.final is not None and self.queue.empty():
            return self.final
        getter = asyncio.ensure_future(self.queue.get())
        try:
            await asyncio.wait({getter, self.pump}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                self.pump.result()  # the server's receive raised: so does the app's
                return self.final or {"type": "http.disconnect"}
            return getter.result()
        finally:
            getter.cancel()

    async def close(self) -> None:
        """Stop relaying (the app is done)."""
        if not self.pump.done():
            self.pump.cancel()
        await asyncio.wait([self.pump])
        if not self.pump.cancelled():
            self.pump.exception()  # retrieved: the app has already seen it, if it asked


async def _refuse(refusal: Refusal | Response, scope: Scope, receive: Receive, send: Send) -> None:
    """Send the refusal (to a WebSocket handshake: as a denial response, if the server can)."""
    if isinstance(refusal, Response):  # the on_refusal hook's own (an ASGI app)
        if scope["type"] == "http":
            await refusal(scope, receive, send)
            return
        # A handshake is denied with a whole body: a streamed one is not sent.
        body = getattr(refusal, "body", b"")
        refusal = (refusal.status_code, list(refusal.raw_headers), bytes(body))
    if scope["type"] == "http":
        await send_response(send, *refusal)
        return
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        await send_response(send, *refusal, websocket=True)
    else:
        # Closing before accepting makes the server answer 403 to the handshake.
        await send({"type": "websocket.close", "code": 1008, "reason": "rate limited"})
