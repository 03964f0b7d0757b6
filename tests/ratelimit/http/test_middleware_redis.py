"""The middleware on real Redis: an outage mid-traffic, and a flood of distinct identities."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from redis import asyncio as aioredis

from headway import (
    ClientAddress,
    FixedWindow,
    LimiterSettings,
    Policy,
    RateLimitEvent,
    RedisRateLimitBackend,
    Rule,
    TokenBucket,
)
from headway._http import ASGIApp, Message
from tests.ratelimit.apps import Calls, client, sf_list, starlette_app
from tests.servers import RedisServers, Server

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

PLENTY = FixedWindow(limit=100_000, window=60.0)  # never reached


@pytest.fixture
async def server(redis_servers: RedisServers) -> AsyncIterator[Server]:
    """A redis-server of this test's own, which it may kill and restart on the same port."""
    started = redis_servers.start()
    try:
        yield started
    finally:
        redis_servers.stop(started)


@dataclass
class Traffic:
    """Responses seen by workers, by the phase in which each request started *and* ended."""

    phase: str = "up"
    seen: dict[tuple[str, str], list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    counted: dict[str, anyio.Event] = field(default_factory=dict)
    need: int = 20

    def record(self, started: str, path: str, status: int, headers: dict[str, str]) -> None:
        if started != self.phase:
            return  # straddled a phase change: says nothing about either phase
        bucket = self.seen.setdefault((started, path), [])
        bucket.append((status, headers))
        paths = {p for (ph, p) in self.seen if ph == started}
        if len(paths) == 2 and all(len(self.seen[started, p]) >= self.need for p in paths):
            self.counted.setdefault(started, anyio.Event()).set()

    async def wait(self, phase: str) -> None:
        await self.counted.setdefault(phase, anyio.Event()).wait()


async def test_redis_stopped_mid_traffic_fails_open_or_closed_then_recovers(
    redis_servers: RedisServers, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    backend = RedisRateLimitBackend.from_url(server.url, timeout=0.5)
    rules = [
        Rule(PLENTY, routes=["/users/{id}"], name="open", fail="open"),
        Rule(PLENTY, routes=["/orders/{id}"], name="closed", fail="closed"),
    ]
    events: list[RateLimitEvent] = []
    calls = Calls()
    app = starlette_app(
        calls, rules=rules, backend=backend,
        limiter=LimiterSettings(budget=0.5, retry_on_error=2.0), on_decision=events.append,
    )  # fmt: skip
    traffic = Traffic()
    try:
        await drive(traffic, app, redis_servers, server, caplog)
    finally:
        await backend.client.aclose()
    check_outage(traffic, events, caplog)


async def drive(
    traffic: Traffic,
    app: Any,
    redis_servers: RedisServers,
    server: Server,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Four clients send requests while Redis goes down and comes back."""

    async def worker(n: int) -> None:
        path = "/users/1" if n % 2 else "/orders/1"
        async with client(app, ip=f"192.0.2.{n}") as http:
            while traffic.phase != "done":
                started = traffic.phase
                response = await http.get(path)
                traffic.record(started, path, response.status_code, dict(response.headers))

    caplog.set_level(logging.INFO, logger="headway.ratelimit")
    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            for n in range(4):
                group.start_soon(worker, n)
            await traffic.wait("up")
            redis_servers.stop(server)
            traffic.phase = "down"
            await traffic.wait("down")
            redis_servers.restart(server)
            traffic.phase = "back"
            await traffic.wait("back")
            traffic.phase = "done"


def check_outage(
    traffic: Traffic, events: list[RateLimitEvent], caplog: pytest.LogCaptureFixture
) -> None:
    def statuses(phase: str, path: str) -> set[int]:
        return {status for status, _ in traffic.seen[phase, path]}

    assert statuses("up", "/users/1") == statuses("up", "/orders/1") == {200}
    # Down: the fail-open rule keeps serving, without numbers it cannot know...
    assert statuses("down", "/users/1") == {200}
    for _, headers in traffic.seen["down", "/users/1"]:
        assert sf_list(headers["ratelimit-policy"]) == {"open": {"q": 100_000, "w": 60}}
        assert "ratelimit" not in headers
    # ... and the fail-closed rule answers 503 with Retry-After and a problem document.
    assert statuses("down", "/orders/1") == {503}
    for _, headers in traffic.seen["down", "/orders/1"]:
        assert headers["retry-after"] == "2"
        assert headers["content-type"] == "application/problem+json"
        assert headers["cache-control"] == "no-store"
    # Back: both recover (a first request may still meet a connection of the dead server).
    for path in ("/users/1", "/orders/1"):
        after = [status for status, _ in traffic.seen["back", path]]
        assert after[-10:] == [200] * 10, after
        assert after.count(200) >= len(after) - 2, after
        last = traffic.seen["back", path][-1][1]
        assert sf_list(last["ratelimit"])
    # One warning per rule when the outage starts, one when it ends; errored decisions counted.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("failing open" in w for w in warnings) == 1
    assert sum("failing closed" in w for w in warnings) == 1
    assert sum("answering again" in w for w in warnings) == 2
    errored = [e for e in events if e.outcome == "errored"]
    assert {e.rule for e in errored} == {"open", "closed"}
    assert {e.decision.allowed for e in errored if e.rule == "open"} == {True}
    assert {e.decision.allowed for e in errored if e.rule == "closed"} == {False}


async def call(app: ASGIApp, path: str, forwarded_for: str) -> int:
    """One GET straight through the ASGI app (cheaper than httpx for a flood)."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "client": ("127.0.0.1", 40000), "server": ("test", 80),
        "headers": [(b"host", b"test"), (b"x-forwarded-for", forwarded_for.encode())],
    }  # fmt: skip
    statuses: list[int] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(scope, receive, send)
    return statuses[0]


@pytest.fixture
async def redis(server: Server) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(server.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.mark.slow
async def test_a_flood_of_distinct_identities_keeps_redis_memory_bounded(
    redis: aioredis.Redis,
) -> None:
    """10,000 identities, two policies each: every key has a TTL, all are gone after it."""
    policies: dict[str, Policy] = {"second": FixedWindow(5, 1.0), "burst": TokenBucket(5, 5, 1.0)}
    identity = ClientAddress(trusted_proxies=["127.0.0.0/8"])
    # A generous budget: this test is about memory, not about a loaded machine's latency.
    app = starlette_app(
        Calls(), rules=[Rule(policies, name="api")], backend=RedisRateLimitBackend(redis),
        identity=identity, limiter=LimiterSettings(budget=5.0),
    )  # fmt: skip
    flood, workers = 10_000, 20
    baseline = (await redis.info("memory"))["used_memory"]
    statuses: list[int] = []
    regular: list[int] = []

    async def flooder(start: int) -> None:
        for i in range(start, flood, workers):
            address = f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}"
            statuses.append(await call(app, "/users/1", address))

    async def regular_client() -> None:
        async with client(app, ip="127.0.0.1") as http:
            while len(statuses) < flood:
                response = await http.get("/users/1", headers={"x-forwarded-for": "192.0.2.1"})
                regular.append(response.status_code)
                await anyio.sleep(0.25)  # a polite client, under its 5 per second

    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            for start in range(workers):
                group.start_soon(flooder, start)
            group.start_soon(regular_client)
    assert statuses == [200] * flood  # each identity is far under its own quota
    assert regular
    assert set(regular) == {200}  # the app kept serving a regular client during the flood
    keys = [key async for key in redis.scan_iter(count=1000)]
    assert 0 < len(keys) <= 2 * (flood + 1)
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.pttl(key)
        ttls: list[int] = await pipe.execute()
    # -2: expired since the SCAN (0: about to); -1 (no TTL) would be a leak.
    assert [ttl for ttl in ttls if not (ttl == -2 or 0 <= ttl <= 1000)] == []
    peak = (await redis.info("memory"))["used_memory"]
    assert peak - baseline < 2 * (flood + 1) * 250  # ~120 bytes per key, with room to spare
    await anyio.sleep(1.1)  # past every TTL
    assert [key async for key in redis.scan_iter(count=1000)] == []  # SCAN expires what it meets
    assert await redis.dbsize() == 0
