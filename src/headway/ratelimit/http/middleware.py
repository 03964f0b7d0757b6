"""``RateLimitMiddleware``: rate-limit rules in front of any ASGI app (pure ASGI)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Sequence

from headway._clock import Clock
from headway._http import ASGIApp, Message, Receive, Scope, Send, send_response
from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.http.guard import Check, DecisionHook, Guard, Outcome, rules_need_route
from headway.ratelimit.http.identity import ClientAddress, Identity
from headway.ratelimit.http.routes import RouteCache, RouteFunction
from headway.ratelimit.http.rules import Pattern, Rule, _check_patterns, _matches

__all__ = ["RateLimitMiddleware"]


class RateLimitMiddleware:
    """Check every HTTP request against ``rules`` before the app sees it.

    A request that a rule refuses gets 429 (``application/problem+json`` of
    type ``quota-exceeded`` naming the violated policies, ``Retry-After``,
    ``Cache-Control: no-store``); one whose rule fails closed while the
    backend is down gets 503 with ``Retry-After``. Every response of a limited
    request carries ``RateLimit-Policy`` and ``RateLimit``
    (draft-ietf-httpapi-ratelimit-headers-10), plus ``X-RateLimit-*`` with
    ``legacy_headers``.

    Rules decide on the route template, found in the app's router (Starlette,
    FastAPI; see ``route``). ``identity`` is the rules' default identity: the
    socket peer's address unless you trust proxies explicitly (see
    ``ClientAddress``). ``exempt`` routes skip every rule. ``shadow`` makes
    every rule report without refusing. ``on_decision`` is called with a
    ``RateLimitEvent`` for every decision. ``websocket`` also limits
    WebSocket connection attempts (as GET requests); other scopes pass
    through. ``budget``, ``retry_on_error`` and ``cache_blocked`` configure
    each rule's ``RateLimiter``; with no ``backend``, limits live in this
    process's memory.

    ``route`` overrides how the template is found: a function of the scope
    returning the template (or None when unknown: rules then match the raw
    path).
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
        budget: float = 0.25,
        retry_on_error: float = 1.0,
        cache_blocked: bool | int = False,
        clock: Clock | None = None,
    ) -> None:
        self.app = app
        self.guard = Guard(
            rules,
            backend=backend,
            identity=identity if identity is not None else ClientAddress(),
            shadow=shadow,
            on_decision=on_decision,
            legacy_headers=legacy_headers,
            budget=budget,
            retry_on_error=retry_on_error,
            cache_blocked=cache_blocked,
            clock=clock,
        )
        self.exempt = _check_patterns("exempt", exempt)
        self.websocket = websocket
        self.route: RouteFunction = route or RouteCache(app)
        # Finding the template walks the router: skip it when nothing would read it
        # (no pattern, no per-route quota and, checked per request, no hook to report it).
        self._needs_route = bool(self.exempt) or rules_need_route(self.guard.rules)

    @property
    def counts(self) -> collections.Counter[tuple[str, Outcome]]:
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
        needs_route = self._needs_route or self.guard.on_decision is not None
        route = self.route(scope) if needs_route else None
        if self.exempt and _matches(self.exempt, route if route is not None else scope["path"]):
            await self.app(scope, receive, send)
            return
        check = await self.guard.check(scope, method, route)
        try:
            if check.blocking is not None:
                refuse = _refuse if kind == "http" else _refuse_websocket
                await refuse(check, scope, receive, send)
            elif not check.checked:
                await self.app(scope, receive, send)
            elif not check.slots:
                await self.app(scope, receive, _with_headers(send, check.headers(), kind))
            else:
                await self._holding(check, scope, receive, send, kind)
        finally:
            if check.slots:  # the app returned or raised: free its slots
                await check.release()

    async def _holding(
        self, check: Check, scope: Scope, receive: Receive, send: Send, kind: str
    ) -> None:
        """Run the app while the request holds concurrency slots."""
        watch = _DisconnectWatch(receive, check) if kind == "http" else None
        send = _with_headers(_releasing(send, check), check.headers(), kind)
        try:
            await self.app(scope, watch or receive, send)
        finally:
            if watch is not None:
                await watch.close()


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]], kind: str) -> Send:
    start = "http.response.start" if kind == "http" else "websocket.accept"

    # Not a coroutine: it hands back the server's awaitable (one frame less per message).
    def wrapped(message: Message) -> Awaitable[None]:
        if message["type"] == start:
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        return send(message)

    return wrapped


def _releasing(send: Send, check: Check) -> Send:
    """Free the request's slots once its response is complete (not after background tasks)."""

    async def wrapped(message: Message) -> None:
        await send(message)
        kind = message["type"]
        if (kind == "http.response.body" and not message.get("more_body", False)) or (
            kind == "websocket.close"
        ):
            await check.release()

    return wrapped


class _DisconnectWatch:
    """A ``receive`` that frees the request's slots as soon as its client is gone.

    A task relays the server's messages to the app one at a time (a queue of
    one: no read-ahead beyond a single body chunk), so a departure is seen
    even while the handler never calls ``receive``; the app gets every
    message, and ``http.disconnect`` again on every call after the last.
    """

    def __init__(self, receive: Receive, check: Check) -> None:
        self.receive = receive
        self.check = check
        self.queue: asyncio.Queue[Message] = asyncio.Queue(maxsize=1)
        self.final: Message | None = None
        self.pump = asyncio.get_running_loop().create_task(self._relay())

    async def _relay(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                await self.check.release()
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


async def _refuse(check: Check, scope: Scope, receive: Receive, send: Send) -> None:
    status, headers, body = check.refusal()
    await send_response(send, status, headers, body)


async def _refuse_websocket(check: Check, scope: Scope, receive: Receive, send: Send) -> None:
    status, headers, body = check.refusal()
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        start = {"type": "websocket.http.response.start", "status": status, "headers": headers}
        await send(start)
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        # Closing before accepting makes the server answer 403 to the handshake.
        await send({"type": "websocket.close", "code": 1008, "reason": "rate limited"})
