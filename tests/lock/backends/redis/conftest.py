"""The Redis lock backends the Redis-only test modules share, on a flushed database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from redis import asyncio as aioredis

from headway import RedisLockBackend, SyncRedisLockBackend


@pytest.fixture
async def redis_backend(redis_client: aioredis.Redis) -> AsyncIterator[RedisLockBackend]:
    backend = RedisLockBackend(redis_client)
    yield backend
    await backend.aclose()


@pytest.fixture
def sync_redis_backend(sync_redis_client: redis.Redis) -> Iterator[SyncRedisLockBackend]:
    backend = SyncRedisLockBackend(sync_redis_client)
    yield backend
    backend.close()
