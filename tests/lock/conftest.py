from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis import asyncio as aioredis

from headway import LockBackend, MemoryLockBackend, RedisLockBackend


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[LockBackend]:
    """Every queued backend: the in-memory reference and Redis (flushed db)."""
    if request.param == "memory":
        yield MemoryLockBackend()
        return
    client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    await client.flushdb()
    redis_backend = RedisLockBackend(client)
    try:
        yield redis_backend
    finally:
        await redis_backend.aclose()
        await client.aclose()
