"""``max_wait`` on the decorator (async and sync handlers) and the FastAPI dependency:
refused requests wait their turn, then pass or get the usual refusal; a client that
leaves while it waits gives its turn away; the body reaches the handler whole."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway import (
    MemoryRateLimitBackend,
    RateLimitDependency,
    RateLimitEvent,
    RateLimitRefused,
    TokenBucket,
    rate_limit,
)
from tests.ratelimit.apps import client
from tests.ratelimit.http.driven import Client

pytestmark = pytest.mark.anyio

#: One request every 0.1 s, none saved up.
EVERY_100_MS = TokenBucket(1, 1, 0.1)


class Times:
    """The ``on_decision`` hook: when each request was admitted or refused."""

    def __init__(self) -> None:
        self.allowed: list[float] = []
        self.rejected: list[float] = []

    def __call__(self, event: RateLimitEvent) -> None:
        (self.allowed if event.outcome == "allowed" else self.rejected).append(time.monotonic())

    def assert_paced(self, every: float) -> None:
        gaps = [b - a for a, b in zip(self.allowed, self.allowed[1:], strict=False)]
        assert all(gap > every * 0.8 for gap in gaps), gaps


def decorated_app(times: Times, max_wait: float) -> Starlette:
    options: dict[str, Any] = {"max_wait": max_wait, "on_decision": times}

    @rate_limit(EVERY_100_MS, **options)
    async def async_items(request: Request) -> Response:
        return JSONResponse({"size": len(await request.body())})

    @rate_limit(EVERY_100_MS, **options)
    def sync_items(request: Request) -> Response:
        return JSONResponse({"sync": True})

    return Starlette(
        routes=[Route("/async", async_items, methods=["GET", "POST"]), Route("/sync", sync_items)]
    )


async def gather_gets(http: httpx.AsyncClient, path: str, n: int) -> list[httpx.Response]:
    return list(await asyncio.gather(*(http.get(path) for _ in range(n))))


@pytest.mark.parametrize("path", ["/async", "/sync"])
async def test_decorated_endpoints_wait_their_turn(path: str) -> None:
    times = Times()
    async with client(decorated_app(times, max_wait=5)) as http:
        responses = await asyncio.wait_for(gather_gets(http, path, 4), 5)
    assert [r.status_code for r in responses] == [200] * 4
    assert len(times.allowed) == 4
    assert times.rejected == []
    times.assert_paced(0.1)


async def test_decorated_endpoint_refuses_what_it_cannot_admit_in_time() -> None:
    times = Times()
    async with client(decorated_app(times, max_wait=0.15)) as http:
        responses = await asyncio.wait_for(gather_gets(http, "/async", 4), 5)
    assert sorted(r.status_code for r in responses) == [200, 200, 429, 429]
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["content-type"] == "application/problem+json"
    assert "retry-after" in refused.headers
    assert len(times.allowed) == 2
    assert len(times.rejected) == 2


async def test_decorated_endpoint_lets_a_departed_client_go_and_keeps_the_body() -> None:
    """b leaves while it waits: it is answered 499 (nobody reads it) and c, behind it, takes
    its turn, with its body intact (the watch read it while c waited)."""
    times = Times()
    app = decorated_app(times, max_wait=5)
    a, b = Client(), Client()
    c = Client([b"x" * 1000, b"y" * 1000], method="POST")

    async def send(one: Client) -> None:
        await app(one.scope("/async"), one.receive, one.send)

    await send(a)
    waiting = asyncio.ensure_future(asyncio.gather(send(b), send(c)))
    await asyncio.wait_for(asyncio.gather(b.watched.wait(), c.watched.wait()), 5)
    b.leave.set()
    await asyncio.wait_for(waiting, 5)
    assert (a.status, b.status, c.status) == (200, 499, 200)
    assert c.body == b'{"size":2000}'
    assert len(times.allowed) == 2
    assert times.allowed[1] - times.allowed[0] < 0.2  # c had b's turn, not the one after


class Order(BaseModel):
    n: int


def dependency_app(limit: RateLimitDependency) -> FastAPI:
    app = FastAPI()
    app.add_exception_handler(RateLimitRefused, RateLimitRefused.handler)

    @app.get("/items", dependencies=[Depends(limit)])
    async def items(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}  # the message the watch read, replayed

    @app.post("/orders", dependencies=[Depends(limit)])
    async def orders(order: Order) -> dict[str, int]:
        return {"n": order.n}

    return app


async def test_the_dependency_waits_and_keeps_the_body() -> None:
    times = Times()
    limit = RateLimitDependency(
        EVERY_100_MS, per="rule", max_wait=5, on_decision=times, backend=MemoryRateLimitBackend()
    )
    async with client(dependency_app(limit)) as http:
        responses = await asyncio.wait_for(
            asyncio.gather(
                http.get("/items"), http.post("/orders", json={"n": 7}), http.get("/items")
            ),
            5,
        )
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert [r.json() for r in responses] == [{"size": 0}, {"n": 7}, {"size": 0}]
    assert all(r.headers["ratelimit"].startswith('"default";r=0') for r in responses)
    assert len(times.allowed) == 3
    times.assert_paced(0.1)


async def test_the_dependency_refuses_what_it_cannot_admit_in_time() -> None:
    limit = RateLimitDependency(EVERY_100_MS, max_wait=0.05)
    async with client(dependency_app(limit)) as http:
        responses = await asyncio.wait_for(gather_gets(http, "/items", 3), 5)
    assert sorted(r.status_code for r in responses) == [200, 429, 429]
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["content-type"] == "application/problem+json"


async def test_the_dependency_lets_a_departed_client_go() -> None:
    times = Times()
    limit = RateLimitDependency(EVERY_100_MS, max_wait=5, on_decision=times)
    app = dependency_app(limit)
    a, b, c = Client(), Client(), Client()

    async def send(one: Client) -> None:
        await app(one.scope("/items"), one.receive, one.send)

    await send(a)
    waiting = asyncio.ensure_future(asyncio.gather(send(b), send(c)))
    await asyncio.wait_for(asyncio.gather(b.watched.wait(), c.watched.wait()), 5)
    b.leave.set()
    await asyncio.wait_for(waiting, 5)
    assert (a.status, b.status, c.status) == (200, 499, 200)
    assert len(times.allowed) == 2
    assert times.allowed[1] - times.allowed[0] < 0.2


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"max_wait": -0.5}, ValueError),
        ({"max_wait": None}, TypeError),
        ({"max_wait": 1, "max_waiting": -1}, ValueError),
        ({"max_wait": 1, "max_waiting": "10"}, TypeError),
    ],
)
def test_bad_waiting_options_fail_at_once(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match="max_wait"):
        rate_limit(EVERY_100_MS, **options)
    with pytest.raises(error, match="max_wait"):
        RateLimitDependency(EVERY_100_MS, **options)
