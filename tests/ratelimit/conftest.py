"""Limiters over every backend, and a dedicated Redis server for intrusive tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from redis import asyncio as aioredis

from headway import (
    ConcurrencyBackend,
    MemoryRateLimitBackend,
    RateLimitBackend,
    RedisRateLimitBackend,
)
from tests.servers import RedisServers, Server

BackendFactory = Callable[[], RateLimitBackend]


@pytest.fixture(params=["memory", "redis"])
async def make_backend(
    request: pytest.FixtureRequest,
) -> AsyncIterator[BackendFactory]:
    """Builds backends of one kind (the same suite runs over each)."""
    if request.param == "memory":
        yield MemoryRateLimitBackend
        return
    client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    await client.flushdb()
    try:
        yield lambda: RedisRateLimitBackend(client)
    finally:
        await client.aclose()


@pytest.fixture(params=["memory", "redis"])
async def slot_backend(request: pytest.FixtureRequest) -> AsyncIterator[ConcurrencyBackend]:
    """A backend keeping concurrency slots; Redis through a pool for real concurrency."""
    if request.param == "memory":
        yield MemoryRateLimitBackend()
        return
    pool = aioredis.BlockingConnectionPool.from_url(
        request.getfixturevalue("redis_url"), max_connections=32
    )
    client = aioredis.Redis.from_pool(pool)
    await client.flushdb()
    try:
        yield RedisRateLimitBackend(client)
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def own_server(redis_servers: RedisServers) -> Iterator[Server]:
    """A redis-server of our own: for SCRIPT FLUSH, SIGSTOP and command counting."""
    server = redis_servers.start()
    try:
        yield server
    finally:
        redis_servers.stop(server)
