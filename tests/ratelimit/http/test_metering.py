"""Metered costs over HTTP: a rule reserves an estimate per request and settles the actual
cost when the response ends: from a header, a function of the response, or the units the
handler reported to its ``Meter`` while streaming (a client that leaves mid-stream is
charged what was seen); on the in-memory backend and on Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from fastapi import Depends, FastAPI
from redis import asyncio as aioredis
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from headway import (
    FixedWindow,
    MemoryRateLimitBackend,
    Meter,
    Metering,
    RateLimitBackend,
    RateLimitDependency,
    RateLimitMiddleware,
    RedisRateLimitBackend,
    Rule,
    TokenBucket,
    rate_limit,
)
from headway._http import Message
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio

REQUESTS = FixedWindow(100, NO_ROLLOVER)
TOKENS = TokenBucket(1000, 1000, 86_400.0)  # a day to refill: nothing comes back in a test


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


def llm_app(
    backend: RateLimitBackend, chunk_sent: anyio.Event | None = None, **metering: Any
) -> Starlette:
    """``/stream?n=`` streams n chunks, reporting one unit each; ``/complete`` answers at
    once with ``X-Tokens-Used: 7``; ``/fails`` raises after reporting 3."""

    async def stream(request: Request) -> Response:
        meter = Meter.of(request)

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(int(request.query_params["n"])):
                meter.add(1)
                yield f"token {i}\n".encode()
                if chunk_sent is not None and i == 2:
                    chunk_sent.set()
                    await anyio.sleep_forever()  # the model stalls; the client leaves

        return StreamingResponse(chunks())

    async def complete(request: Request) -> Response:
        return JSONResponse({"text": "..."}, headers={"X-Tokens-Used": "7"})

    async def fails(request: Request) -> Response:
        Meter.of(request).add(3)
        raise RuntimeError("the model went away")

    rule = Rule(
        {"requests": REQUESTS, "tokens": TOKENS},
        name="llm",
        identity=lambda scope: "user",
        metering=Metering(**{"estimate": 50, "policies": ["tokens"], **metering}),
    )
    routes = [Route("/stream", stream), Route("/complete", complete), Route("/fails", fails)]
    middleware = Middleware(RateLimitMiddleware, rules=[rule], backend=backend)
    return Starlette(routes=routes, middleware=[middleware])


async def left(app: Starlette) -> tuple[int, int]:
    """(requests, tokens) remaining for the user, as a peek sees them."""
    limiter = _middleware(app).guard.rules[0].limiter
    assert limiter is not None
    parts = (await limiter.peek("llm/user")).policies
    return parts[0].remaining, parts[1].remaining


def _middleware(app: Starlette) -> RateLimitMiddleware:
    stack: Any = app.middleware_stack
    while not isinstance(stack, RateLimitMiddleware):
        stack = stack.app
    return stack


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_a_streamed_response_settles_the_units_it_reported(
    backend: RateLimitBackend,
) -> None:
    app = llm_app(backend)
    async with _client(app) as client:
        response = await client.get("/stream", params={"n": 12})
        assert response.text.count("token") == 12
        # The header was sent before the stream: it shows the estimate charged.
        assert '"tokens";r=950;' in response.headers["ratelimit"]
        assert await left(app) == (99, 988)
        response = await client.get("/stream", params={"n": 120})
        assert await left(app) == (98, 868)  # more than the estimate: the rest charged


async def test_a_header_or_a_function_of_the_response_gives_the_actual_cost(
    backend: RateLimitBackend,
) -> None:
    app = llm_app(backend)
    async with _client(app) as client:
        await client.get("/complete")
    assert await left(app) == (99, 993)

    def by_status(status: int, headers: Any) -> int | None:
        return 0 if status >= 500 else int(headers["x-tokens-used"]) * 2

    app = llm_app(backend, actual=by_status)
    async with _client(app) as client:
        await client.get("/complete")
    assert await left(app) == (98, 979)


async def test_an_app_that_raises_settles_what_it_reported(backend: RateLimitBackend) -> None:
    app = llm_app(backend)
    async with _client(app) as client:
        with pytest.raises(RuntimeError, match="went away"):
            await client.get("/fails")
    assert await left(app) == (99, 997)


async def test_a_client_that_leaves_mid_stream_is_charged_what_was_seen(
    backend: RateLimitBackend,
) -> None:
    chunk_sent = anyio.Event()
    app = llm_app(backend, chunk_sent=chunk_sent)
    sent: list[Message] = []
    requested = False

    async def receive() -> Message:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await chunk_sent.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        await anyio.sleep(0)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/stream", "raw_path": b"/stream", "root_path": "",
        "query_string": b"n=100000", "headers": [(b"host", b"test")], "client": ("192.0.2.1", 1),
        "server": ("test", 80),
    }  # fmt: skip
    with anyio.fail_after(10):
        await app(scope, receive, send)
    chunks = sum(1 for m in sent if m["type"] == "http.response.body" and m.get("body"))
    # Settled at what the handler had reported when the client left: the 3 chunks sent,
    # not the estimate (50) and not the 100,000 asked for.
    assert chunks == 3
    assert await left(app) == (99, 997)


async def test_a_request_another_rule_refuses_settles_at_zero(backend: RateLimitBackend) -> None:
    tokens = Rule(
        TOKENS, name="tokens", identity=lambda scope: "user", metering=Metering(estimate=40)
    )
    requests = Rule(FixedWindow(1, NO_ROLLOVER), name="requests", identity=lambda scope: "user")

    async def complete(request: Request) -> Response:
        return JSONResponse({}, headers={"X-Tokens-Used": "7"})

    middleware = Middleware(RateLimitMiddleware, rules=[tokens, requests], backend=backend)
    app = Starlette(routes=[Route("/complete", complete)], middleware=[middleware])
    async with _client(app) as client:
        assert (await client.get("/complete")).status_code == 200
        assert (await client.get("/complete")).status_code == 429
    limiter = _middleware(app).guard.rules[0].limiter
    assert limiter is not None
    assert (await limiter.peek("tokens/user")).remaining == 993


def test_metering_is_checked_when_the_rule_is_made() -> None:
    with pytest.raises(ValueError, match="names no rate policy"):
        Rule({"a": REQUESTS}, metering=Metering(estimate=1, policies=["b"]))
    with pytest.raises(ValueError, match="not a function"):
        Rule(lambda scope: REQUESTS, metering=Metering(estimate=1))
    with pytest.raises(ValueError, match="estimate must be >= 0"):
        Metering(estimate=-1)
    with pytest.raises(TypeError, match="list of policy names"):
        Metering(estimate=1, policies="tokens")
    with pytest.raises(ValueError, match="ttl"):
        Metering(estimate=1, ttl=0)
    meter = Meter.of({"type": "http"})  # no metered rule: a detached meter, counting
    meter.add(2)
    assert meter.units == 2
    with pytest.raises(ValueError, match=">= 0"):
        meter.add(-1)


def _streaming(request: Request, n: int) -> StreamingResponse:
    meter = Meter.of(request)

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(n):
            meter.add(2)
            yield f"token {i}\n".encode()

    return StreamingResponse(chunks())


async def test_the_decorator_settles_once_the_returned_response_is_sent(
    backend: RateLimitBackend,
) -> None:
    metering = Metering(estimate=50, policies=["tokens"])
    limited = rate_limit(
        named={"requests": REQUESTS, "tokens": TOKENS},
        name="llm",
        identity=lambda scope: "user",
        backend=backend,
        metering=metering,
    )

    @limited
    async def stream(request: Request) -> Response:
        return _streaming(request, 30)

    app = Starlette(routes=[Route("/stream", stream)])
    async with _client(app) as client:
        assert (await client.get("/stream")).text.count("token") == 30
    limiter = stream.guard.rules[0].limiter  # type: ignore[attr-defined]
    parts = (await limiter.peek("llm/user")).policies
    assert (parts[0].remaining, parts[1].remaining) == (99, 940)


async def test_fastapi_values_and_streams_settle_through_decorator_and_dependency(
    backend: RateLimitBackend,
) -> None:
    metering = Metering(estimate=50)
    limited = rate_limit(
        TOKENS, name="value", identity=lambda scope: "user", backend=backend, metering=metering
    )
    dependency = RateLimitDependency(
        TOKENS, name="dep", per="rule", identity=lambda scope: "user", backend=backend,
        metering=metering,
    )  # fmt: skip
    api = FastAPI()

    @api.get("/value")
    @limited
    async def value(response: Response) -> dict[str, str]:
        response.headers["X-Tokens-Used"] = "9"  # FastAPI's sub-response
        return {"text": "..."}

    @api.get("/stream", dependencies=[Depends(dependency)])
    async def stream(request: Request) -> Response:
        return _streaming(request, 40)

    async with _client(api) as client:
        assert (await client.get("/value")).status_code == 200
        assert (await client.get("/stream")).text.count("token") == 40
    assert (await value.guard.rules[0].limiter.peek("value/user")).remaining == 991  # type: ignore[attr-defined]
    # FastAPI runs a dependency's exit code after the response is sent: all 80 units.
    assert (await dependency.guard.rules[0].limiter.peek("dep/user")).remaining == 920  # type: ignore[union-attr]


async def test_a_cost_sent_in_the_trailers_is_settled_after_them(backend: RateLimitBackend) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
        await send({"type": "http.response.body", "body": b"tok tok", "more_body": False})
        # Not settled yet: the cost comes in the trailers.
        assert (await left_of(limiter)) == (99, 950)
        await send({"type": "http.response.trailers", "headers": [(b"x-tokens-used", b"11")]})

    rule = Rule(
        {"requests": REQUESTS, "tokens": TOKENS},
        name="llm",
        identity=lambda scope: "user",
        metering=Metering(estimate=50, policies=["tokens"]),
    )
    middleware = RateLimitMiddleware(app, rules=[rule], backend=backend)
    limiter = middleware.guard.rules[0].limiter
    assert limiter is not None

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        pass

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/", "raw_path": b"/", "root_path": "", "query_string": b"",
        "headers": [], "client": ("192.0.2.1", 1), "server": ("test", 80),
        "extensions": {"http.response.trailers": {}},
    }  # fmt: skip
    await middleware(scope, receive, send)
    assert await left_of(limiter) == (99, 989)


async def left_of(limiter: Any) -> tuple[int, int]:
    parts = (await limiter.peek("llm/user")).policies
    return parts[0].remaining, parts[1].remaining


async def test_a_metered_request_may_wait_in_line_for_its_estimate(
    backend: RateLimitBackend,
) -> None:
    tokens = TokenBucket(10, 100, 1.0)  # 10 at once, 100 a second: 0.1 s per estimate

    async def complete(request: Request) -> Response:
        return JSONResponse({}, headers={"X-Tokens-Used": "10"})

    rule = Rule(tokens, name="llm", identity=lambda scope: "user", metering=Metering(estimate=10))
    middleware = Middleware(RateLimitMiddleware, rules=[rule], backend=backend, max_wait=2.0)
    app = Starlette(routes=[Route("/complete", complete)], middleware=[middleware])
    async with _client(app) as client:
        with anyio.fail_after(5):
            codes = [(await client.get("/complete")).status_code for _ in range(3)]
    assert codes == [200, 200, 200]  # the later two waited for the bucket, each charged once
    limiter = _middleware(app).guard.rules[0].limiter
    assert limiter is not None
    # One estimate's refill away at most: a try refused in the line charged nothing.
    assert (await limiter.peek("llm/user", cost=10)).retry_after <= 0.1


async def test_the_decorator_settles_a_sync_handlers_response(backend: RateLimitBackend) -> None:
    @rate_limit(
        TOKENS, name="sync", identity=lambda scope: "user", backend=backend,
        metering=Metering(estimate=50),
    )  # fmt: skip
    def complete(request: Request) -> Response:  # run in the thread pool
        return JSONResponse({}, headers={"X-Tokens-Used": "4"})

    app = Starlette(routes=[Route("/complete", complete)])
    async with _client(app) as client:
        assert (await client.get("/complete")).status_code == 200
    limiter = complete.guard.rules[0].limiter  # type: ignore[attr-defined]
    assert (await limiter.peek("sync/user")).remaining == 996
