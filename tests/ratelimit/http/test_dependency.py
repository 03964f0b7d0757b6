"""``RateLimitDependency`` on real FastAPI apps: quotas, headers, refusals, OpenAPI."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from fastapi import APIRouter, Depends, FastAPI
from redis import asyncio as aioredis
from starlette.responses import PlainTextResponse, Response

from headway import (
    Concurrency,
    FixedWindow,
    MemoryRateLimitBackend,
    RateLimitBackend,
    RateLimitDependency,
    RateLimitRefused,
    RedisRateLimitBackend,
)
from tests.ratelimit.apps import client, sf_list
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio

TWO = FixedWindow(limit=2, window=NO_ROLLOVER)


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


def app_with(limit: RateLimitDependency, *, handler: bool = True) -> FastAPI:
    app = FastAPI()
    if handler:
        app.add_exception_handler(RateLimitRefused, RateLimitRefused.handler)
    calls: collections.Counter[str] = collections.Counter()
    app.state.calls = calls

    @app.get("/items/{item_id}", dependencies=[Depends(limit)], responses=limit.responses)
    async def item(item_id: int) -> dict[str, int]:
        calls["item"] += 1
        return {"item": item_id}

    @app.get("/other", dependencies=[Depends(limit)])
    def other() -> dict[str, bool]:
        calls["other"] += 1
        return {"ok": True}

    @app.get("/free")
    async def free() -> dict[str, bool]:
        return {"ok": True}

    return app


async def test_a_route_admits_its_quota_then_refuses_with_problem_json(
    backend: RateLimitBackend,
) -> None:
    app = app_with(RateLimitDependency(TWO, name="items", backend=backend))
    async with client(app) as http:
        admitted = [await http.get(f"/items/{i}") for i in range(2)]
        refused = await http.get("/items/7")
        other = await http.get("/other")  # another route: its own quota (per route)
        unlimited = await http.get("/free")
    for i, response in enumerate(admitted):
        assert response.status_code == 200, response.text
        assert response.json() == {"item": i}
        assert sf_list(response.headers["ratelimit-policy"]) == {
            "items": {"q": 2, "w": int(NO_ROLLOVER)}
        }
        assert sf_list(response.headers["ratelimit"])["items"]["r"] == 1 - i
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/problem+json"
    assert (
        int(refused.headers["retry-after"]) == sf_list(refused.headers["ratelimit"])["items"]["t"]
    )
    assert refused.json()["violated-policies"] == ["items"]
    assert sf_list(refused.headers["ratelimit"])["items"]["r"] == 0
    assert app.state.calls == {"item": 2, "other": 1}
    assert other.status_code == 200
    assert "ratelimit" in other.headers
    assert "ratelimit" not in unlimited.headers


async def test_without_the_handler_fastapi_still_answers_429_with_the_fields() -> None:
    app = app_with(RateLimitDependency(TWO), handler=False)
    async with client(app) as http:
        for _ in range(2):
            assert (await http.get("/items/1")).status_code == 200
        refused = await http.get("/items/1")
    assert refused.status_code == 429
    assert refused.json()["detail"].startswith("Too many requests")
    [(_, item)] = sf_list(refused.headers["ratelimit"]).items()
    assert (int(refused.headers["retry-after"]), item["r"]) == (item["t"], 0)
    assert app.state.calls == {"item": 2}


async def test_one_dependency_on_a_router_limits_each_route_on_its_own() -> None:
    limit = RateLimitDependency(TWO)
    router = APIRouter(dependencies=[Depends(limit)], responses=limit.responses)

    @router.get("/a")
    async def a() -> dict[str, str]:
        return {"route": "a"}

    @router.get("/b")
    async def b() -> dict[str, str]:
        return {"route": "b"}

    app = FastAPI()
    app.include_router(router)
    async with client(app) as http:
        statuses = [(await http.get(p)).status_code for p in ("/a", "/b") * 3]
        other_client = client(app, ip="192.0.2.9")
        async with other_client:
            elsewhere = await other_client.get("/a")
    assert statuses == [200, 200, 200, 200, 429, 429]
    assert elsewhere.status_code == 200  # quotas are per client too
    schema = app.openapi()
    assert "429" in schema["paths"]["/a"]["get"]["responses"]


def test_the_refusals_are_in_the_route_openapi_responses() -> None:
    app = app_with(RateLimitDependency(TWO, fail="closed"))
    responses = app.openapi()["paths"]["/items/{item_id}"]["get"]["responses"]
    assert set(responses) == {"200", "422", "429", "503"}
    too_many = responses["429"]
    assert "application/problem+json" in too_many["content"]
    assert set(too_many["headers"]) == {"Retry-After", "RateLimit-Policy", "RateLimit"}
    schema = too_many["content"]["application/problem+json"]["schema"]
    assert schema["required"] == ["type", "title", "status"]
    # 503 only where the rule can fail closed.
    assert set(RateLimitDependency(TWO).responses) == {429}
    deny = FixedWindow(limit=2, window=NO_ROLLOVER, on_error="deny")
    assert set(RateLimitDependency(deny).responses) == {429, 503}
    assert set(RateLimitDependency(deny, fail="open").responses) == {429}


async def test_unnamed_dependencies_with_different_policies_do_not_share_a_quota() -> None:
    backend = MemoryRateLimitBackend()
    one = RateLimitDependency(FixedWindow(limit=1, window=NO_ROLLOVER), per="rule", backend=backend)
    three = RateLimitDependency(
        FixedWindow(limit=3, window=NO_ROLLOVER), per="rule", backend=backend
    )
    app = FastAPI()
    app.add_exception_handler(RateLimitRefused, RateLimitRefused.handler)

    @app.get("/one", dependencies=[Depends(one)])
    async def by_one() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/three", dependencies=[Depends(three)])
    async def by_three() -> dict[str, bool]:
        return {"ok": True}

    async with client(app) as http:
        ones = [(await http.get("/one")).status_code for _ in range(2)]
        threes = [(await http.get("/three")).status_code for _ in range(4)]
    assert ones == [200, 429]
    assert threes == [200, 200, 200, 429]  # a shared key would refuse the third


async def test_a_handler_returning_its_own_response_is_still_limited() -> None:
    limit = RateLimitDependency(TWO)
    app = FastAPI()
    app.add_exception_handler(RateLimitRefused, RateLimitRefused.handler)

    @app.get("/plain", dependencies=[Depends(limit)])
    async def plain() -> Response:
        return PlainTextResponse("plain")

    async with client(app) as http:
        statuses = [(await http.get("/plain")).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]


async def test_an_in_flight_slot_is_held_while_the_handler_runs() -> None:
    limit = RateLimitDependency(Concurrency(limit=1), backend=MemoryRateLimitBackend())
    entered, leave = anyio.Event(), anyio.Event()
    app = FastAPI()
    app.add_exception_handler(RateLimitRefused, RateLimitRefused.handler)

    @app.get("/slow", dependencies=[Depends(limit)])
    async def slow() -> dict[str, bool]:
        entered.set()
        await leave.wait()
        return {"ok": True}

    results: dict[str, Any] = {}
    with anyio.fail_after(10):  # a slot freed too early would admit the second and hang
        await both_then_third(app, entered, leave, results)
    assert results["first"].status_code == 200
    assert results["second"].status_code == 429
    assert results["third"].status_code == 200  # the first one's slot came back


async def both_then_third(
    app: FastAPI, entered: anyio.Event, leave: anyio.Event, results: dict[str, Any]
) -> None:
    async with client(app) as http:

        async def first() -> None:
            results["first"] = await http.get("/slow")

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(first)
            await entered.wait()
            results["second"] = await http.get("/slow")
            leave.set()
        results["third"] = await http.get("/slow")
