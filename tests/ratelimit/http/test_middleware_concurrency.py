"""In-flight limits in the middleware: a slot per request, freed when the response ends,
the client leaves, or the app raises — on the in-memory backend and on Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import anyio
import httpx
import pytest
from redis import asyncio as aioredis
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway import (
    Concurrency,
    FakeClock,
    FixedWindow,
    MemoryRateLimitBackend,
    RateLimitBackend,
    RateLimitEvent,
    RateLimitMiddleware,
    RedisRateLimitBackend,
    Rule,
    rate_limit,
)
from headway._http import Message
from tests.ratelimit.apps import client, sf_list
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[RateLimitBackend]:
    if request.param == "memory":
        yield MemoryRateLimitBackend()
        return
    redis = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    await redis.flushdb()
    try:
        yield RedisRateLimitBackend(redis)
    finally:
        await redis.aclose()


class Gates:
    """Lets a test hold requests inside the app, and know when two are in."""

    def __init__(self) -> None:
        self.inside = 0
        self.both_in = anyio.Event()
        self.proceed = anyio.Event()
        self.background = anyio.Event()
        self.background_done = anyio.Event()

    def enter(self) -> None:
        self.inside += 1
        if self.inside == 2:
            self.both_in.set()


def gated_app(gates: Gates, backend: RateLimitBackend, **options: Any) -> Starlette:
    async def slow(request: Request) -> Response:
        gates.enter()
        await gates.proceed.wait()
        return JSONResponse({"ok": True})

    async def boom(request: Request) -> Response:
        raise RuntimeError("the handler failed")

    async def later() -> None:
        await gates.background.wait()
        gates.background_done.set()

    async def with_background(request: Request) -> Response:
        return JSONResponse({"ok": True}, background=BackgroundTask(later))

    async def ignores_disconnect(request: Request) -> Response:
        gates.enter()
        await gates.proceed.wait()  # the client is long gone; the app does not notice
        return JSONResponse({"ok": True})

    async def fast(request: Request) -> Response:
        return JSONResponse({"ok": True})

    rule = Rule({"inflight": Concurrency(limit=2, ttl=5.0)}, name="slots")
    routes = [
        Route("/slow", slow),
        Route("/boom", boom),
        Route("/background", with_background),
        Route("/ignores-disconnect", ignores_disconnect),
        Route("/fast", fast),
    ]
    middleware = Middleware(RateLimitMiddleware, rules=[rule], backend=backend, **options)
    return Starlette(routes=routes, middleware=[middleware])


async def asgi_get(app: Any, path: str, *, disconnect: anyio.Event | None = None) -> list[Message]:
    """GET ``path`` through the ASGI app; the client leaves when ``disconnect`` is set."""
    sent: list[Message] = []
    requested = False

    async def receive() -> Message:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        if disconnect is not None:
            await disconnect.wait()
        else:
            await anyio.sleep_forever()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": [(b"host", b"test")], "client": ("192.0.2.1", 1),
        "server": ("test", 80),
    }  # fmt: skip
    await app(scope, receive, send)
    return sent


async def test_requests_beyond_the_limit_in_flight_are_refused(backend: RateLimitBackend) -> None:
    gates = Gates()
    events: list[RateLimitEvent] = []
    app = gated_app(gates, backend, on_decision=events.append)
    results: list[Any] = []
    with anyio.fail_after(10):
        async with client(app) as http:

            async def slow() -> None:
                results.append(await http.get("/slow"))

            async with anyio.create_task_group() as group:
                group.start_soon(slow)
                group.start_soon(slow)
                await gates.both_in.wait()  # both hold their slots, inside the handler
                refused = await http.get("/fast")
                gates.proceed.set()
            after = await http.get("/fast")
    assert [r.status_code for r in results] == [200, 200]
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert sf_list(refused.headers["ratelimit-policy"]) == {
        "inflight": {"q": 2, "qu": "concurrent-requests"}
    }
    assert sf_list(refused.headers["ratelimit"]) == {"inflight": {"r": 0, "t": 1}}
    assert refused.json()["violated-policies"] == ["inflight"]
    assert "in flight" in refused.json()["detail"]
    assert after.status_code == 200  # both slots came back when their responses ended
    assert sf_list(after.headers["ratelimit"]) == {"inflight": {"r": 1}}
    assert [e.outcome for e in events] == ["allowed", "allowed", "rejected", "allowed"]


async def test_a_slot_is_freed_when_the_app_raises(backend: RateLimitBackend) -> None:
    app = gated_app(Gates(), backend)
    for _ in range(3):  # three failures with two slots: none may be kept
        with pytest.raises(RuntimeError, match="the handler failed"):
            await asgi_get(app, "/boom")
    async with client(app) as http:
        ok = await http.get("/fast")
    assert sf_list(ok.headers["ratelimit"]) == {"inflight": {"r": 1}}


async def test_a_slot_is_freed_when_the_response_ends_not_after_background_tasks(
    backend: RateLimitBackend,
) -> None:
    gates = Gates()
    app = gated_app(gates, backend)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for _ in range(2):
                group.start_soon(asgi_get, app, "/background")
            # Both responses are sent; their background tasks still wait. Slots are free.
            sent = await asgi_get(app, "/fast")
            headers = dict(sent[0]["headers"])
            gates.background.set()
    assert sent[0]["status"] == 200
    assert sf_list(headers[b"ratelimit"].decode()) == {"inflight": {"r": 1}}
    assert gates.background_done.is_set()


async def test_a_slot_is_freed_when_the_client_disconnects(backend: RateLimitBackend) -> None:
    gates = Gates()
    app = gated_app(gates, backend)
    gone = anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(asgi_get, app, "/ignores-disconnect")
            group.start_soon(partial(asgi_get, app, "/ignores-disconnect", disconnect=gone))
            await gates.both_in.wait()
            full = await asgi_get(app, "/fast")
            gone.set()  # one client leaves; its handler goes on, unaware
            freed: list[Message] = []
            while not freed or freed[0]["status"] != 200:
                # The release follows the disconnect without any other request's help;
                # wait for it by yielding to the event loop, not by sleeping.
                await anyio.wait_all_tasks_blocked()
                freed = await asgi_get(app, "/fast")
            gates.proceed.set()
    assert full[0]["status"] == 429
    assert freed[0]["status"] == 200
    assert gates.inside == 2  # neither handler had finished when the slot came back


async def test_rate_and_in_flight_limits_in_one_rule(backend: RateLimitBackend) -> None:
    async def fast(request: Request) -> Response:
        return JSONResponse({"ok": True})

    rule = Rule({"minute": FixedWindow(3, NO_ROLLOVER), "inflight": Concurrency(2)}, name="api")
    app = Starlette(
        routes=[Route("/fast", fast)],
        middleware=[Middleware(RateLimitMiddleware, rules=[rule], backend=backend)],
    )
    async with client(app) as http:
        responses = [await http.get("/fast") for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert sf_list(responses[0].headers["ratelimit-policy"]) == {
        "minute": {"q": 3, "w": int(NO_ROLLOVER)},
        "inflight": {"q": 2, "qu": "concurrent-requests"},
    }
    first = sf_list(responses[0].headers["ratelimit"])
    assert first["minute"]["r"] == 2
    assert first["inflight"] == {"r": 1}
    assert responses[3].json()["violated-policies"] == ["minute"]  # no slot asked for


async def test_the_decorator_holds_a_slot_while_the_handler_runs() -> None:
    backend = MemoryRateLimitBackend()
    entered, proceed = anyio.Event(), anyio.Event()

    @rate_limit(Concurrency(1), name="one", backend=backend)
    async def slow(request: Request) -> Response:
        entered.set()
        await proceed.wait()
        return JSONResponse({"ok": True})

    @rate_limit(Concurrency(1), name="one", backend=backend)
    def sync_handler(request: Request) -> Response:
        return JSONResponse({"sync": True})

    app = Starlette(routes=[Route("/slow", slow), Route("/sync", sync_handler)])
    with anyio.fail_after(10):
        async with client(app) as http:
            async with anyio.create_task_group() as group:
                group.start_soon(http.get, "/slow")
                await entered.wait()
                refused = await http.get("/sync")
                proceed.set()
            after = await http.get("/sync")
    assert refused.status_code == 429
    assert after.status_code == 200
    assert sf_list(after.headers["ratelimit"]) == {"one": {"r": 0}}


def test_a_rule_holds_at_most_one_concurrency_limit() -> None:
    with pytest.raises(ValueError, match="at most one Concurrency"):
        Rule([Concurrency(1), Concurrency(2)])


class Stuck:
    """A handler that runs until it is cancelled, and says when it entered and ended."""

    def __init__(self) -> None:
        self.entered, self.finished = anyio.Event(), anyio.Event()

    async def handler(self, request: Request) -> Response:
        self.entered.set()
        try:
            await anyio.sleep_forever()  # only the lost lease ends this
        finally:
            self.finished.set()
        raise AssertionError("unreachable")


async def test_a_request_whose_slot_lease_is_lost_gets_503_not_500(
    backend: RateLimitBackend,
) -> None:
    clock = FakeClock()
    if isinstance(backend, MemoryRateLimitBackend):
        backend = MemoryRateLimitBackend(clock=clock)
    stuck = Stuck()

    rule = Rule({"inflight": Concurrency(limit=1, ttl=0.3)}, name="slots")
    app = Starlette(
        routes=[Route("/stuck", stuck.handler)],
        middleware=[Middleware(RateLimitMiddleware, rules=[rule], backend=backend)],
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            sent: list[list[Message]] = []

            async def get() -> None:
                sent.append(await asgi_get(app, "/stuck"))

            group.start_soon(get)
            await stuck.entered.wait()
            # The slot's lease ends under the handler's feet: the clock jumps past it, or
            # Redis forgets it. Its next renewal is refused.
            clock.advance(60)
            if isinstance(backend, RedisRateLimitBackend):
                await backend.client.flushdb()
    assert stuck.finished.is_set()  # the handler was cancelled, not left running
    start, body = sent[0][0], sent[0][-1]
    assert start["status"] == 503
    assert dict(start["headers"])[b"retry-after"] == b"1"
    assert b"ratelimit-slot-lost" in body["body"]


async def test_the_decorator_answers_503_when_the_slot_lease_is_lost() -> None:
    clock = FakeClock()
    backend = MemoryRateLimitBackend(clock=clock)
    stuck = Stuck()

    @rate_limit(Concurrency(1, ttl=0.3), name="one", backend=backend)
    async def endpoint(request: Request) -> Response:
        return await stuck.handler(request)

    app = Starlette(routes=[Route("/stuck", endpoint)])
    with anyio.fail_after(10):
        async with client(app) as http, anyio.create_task_group() as group:
            answers: list[httpx.Response] = []

            async def get() -> None:
                answers.append(await http.get("/stuck"))

            group.start_soon(get)
            await stuck.entered.wait()
            clock.advance(60)  # the slot's lease is over: its next renewal is refused
    assert stuck.finished.is_set()
    assert answers[0].status_code == 503
    assert answers[0].headers["retry-after"] == "1"
    assert answers[0].json()["type"] == "tag:headway.invalid,2026:problems/ratelimit-slot-lost"
