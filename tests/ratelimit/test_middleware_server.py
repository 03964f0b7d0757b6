"""The middleware behind a real uvicorn server on a free loopback port, on Redis."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from redis import asyncio as aioredis

from headway.ratelimit import FixedWindow, RedisRateLimitBackend, Rule, TokenBucket
from tests.ratelimit.apps import AppFactory, Calls, fastapi_app, sf_list, starlette_app

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on a socket bound before it starts (no wait for readiness)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections queue in the backlog until uvicorn accepts them
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve, [sock])
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
    sock.close()


@pytest.mark.parametrize("make_app", [starlette_app, fastapi_app], ids=["starlette", "fastapi"])
async def test_limits_and_headers_over_the_wire(
    make_app: AppFactory, redis_client: aioredis.Redis
) -> None:
    calls = Calls()
    rules = [
        Rule({"burst": TokenBucket(3, 1, 10.0), "minute": FixedWindow(50, 60.0)}, name="api"),
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
        "minute": {"q": 50, "w": 60},
    }
    assert sf_list(first.headers["ratelimit"])["burst"] == {"r": 2, "t": 10}
    limits = sf_list(refused.headers["ratelimit"])
    assert limits["burst"]["r"] == 0
    assert int(refused.headers["retry-after"]) >= limits["burst"]["t"] >= 1
    assert refused.headers["cache-control"] == "no-store"
    assert refused.json()["violated-policies"] == ["burst"]
    assert health.status_code == 429  # the rule covers every route: one quota per client
    assert sf_list(health.headers["ratelimit"])["minute"]["r"] == 47  # all-or-nothing
    keys = await redis_client.keys("*")
    assert keys
    assert all(ttl > 0 for ttl in [await redis_client.pttl(key) for key in keys])
