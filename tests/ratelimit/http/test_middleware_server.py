"""The middleware behind a real uvicorn server on a free loopback port, on Redis."""

from __future__ import annotations

import anyio
import httpx
import pytest
from redis import asyncio as aioredis
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway import (
    Concurrency,
    FixedWindow,
    RateLimitMiddleware,
    RedisRateLimitBackend,
    Rule,
    TokenBucket,
)
from tests.ratelimit.apps import AppFactory, Calls, fastapi_app, sf_list, starlette_app
from tests.ratelimit.http.server import serving

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


@pytest.mark.parametrize("make_app", [starlette_app, fastapi_app], ids=["starlette", "fastapi"])
async def test_limits_and_headers_over_the_wire(
    make_app: AppFactory, redis_client: aioredis.Redis
) -> None:
    calls = Calls()
    rules = [
        # A day-long window: a minute-long one rolled over mid-test once in ~60 runs.
        Rule({"burst": TokenBucket(3, 1, 10.0), "day": FixedWindow(50, 86400.0)}, name="api"),
    ]
    app = make_app(calls, rules=rules, backend=RedisRateLimitBackend(redis_client))
    with anyio.fail_after(30):
        async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
            responses = [await http.get("/users/5") for _ in range(4)]
            health = await http.get("/health")
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert calls["user"] == 3
    first, refused = responses[0], responses[3]
    assert sf_list(first.headers["ratelimit-policy"]) == {
        "burst": {"q": 3, "w": 30},
        "day": {"q": 50, "w": 86400},
    }
    assert sf_list(first.headers["ratelimit"])["burst"] == {"r": 2, "t": 10}
    limits = sf_list(refused.headers["ratelimit"])
    assert limits["burst"]["r"] == 0
    assert int(refused.headers["retry-after"]) == limits["burst"]["t"] >= 1  # burst alone refused
    assert refused.headers["cache-control"] == "no-store"
    assert refused.json()["violated-policies"] == ["burst"]
    assert health.status_code == 429  # the rule covers every route: one quota per client
    assert sf_list(health.headers["ratelimit"])["day"]["r"] == 47  # all-or-nothing
    keys = await redis_client.keys("*")
    assert keys
    assert all(ttl > 0 for ttl in [await redis_client.pttl(key) for key in keys])


async def test_a_client_leaving_a_real_server_frees_its_slot(redis_client: aioredis.Redis) -> None:
    entered, proceed = anyio.Event(), anyio.Event()

    async def stuck(request: Request) -> Response:
        entered.set()
        await proceed.wait()  # never notices that its client left
        return JSONResponse({"late": True})

    async def fast(request: Request) -> Response:
        return JSONResponse({"ok": True})

    rule = Rule({"inflight": Concurrency(limit=1, ttl=10.0)}, name="slots")
    app = Starlette(
        routes=[Route("/stuck", stuck), Route("/fast", fast)],
        middleware=[
            Middleware(
                RateLimitMiddleware, rules=[rule], backend=RedisRateLimitBackend(redis_client)
            )
        ],
    )
    statuses: list[int] = []
    with anyio.fail_after(20):
        async with serving(app) as url:
            async with (
                httpx.AsyncClient(base_url=url) as leaving,
                anyio.create_task_group() as group,
            ):
                group.start_soon(leaving.get, "/stuck")
                await entered.wait()
                async with httpx.AsyncClient(base_url=url) as other:
                    statuses.append((await other.get("/fast")).status_code)
                group.cancel_scope.cancel()  # the first client gives up: its socket closes
            async with httpx.AsyncClient(base_url=url) as other:
                while statuses[-1] != 200:  # uvicorn reports the disconnect asynchronously
                    await anyio.sleep(0.02)
                    statuses.append((await other.get("/fast")).status_code)
            proceed.set()
    assert statuses[0] == 429
    assert statuses[-1] == 200
