"""Redis's ``inspect`` scripts count only live places and live holders: a waiter that
died keeps its place in the keys until a script that writes drops it."""

from __future__ import annotations

import pytest
from redis import asyncio as aioredis

from headway import Lock, RedisLockBackend
from headway.lock.backends.redis.keys import lock_keys
from headway.lock.backends.redis.mode_keys import mode_keys
from headway.lock.shared import ReadWriteLock

pytestmark = pytest.mark.anyio


async def _now_ms(client: aioredis.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_a_lapsed_place_is_not_counted(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    lock = Lock(redis_backend, "report", ttl=10)
    lease = await lock.acquire()
    k, now = lock_keys("report"), await _now_ms(redis_client)
    # A waiter that died a while ago, and one that keeps its place.
    await redis_client.zadd(k.queue, {"dead:10000:": now - 5000, "live:10000:": now})
    await redis_client.zadd(k.places, {"dead:10000:": now - 1000, "live:10000:": now + 10_000})
    assert (await lock.inspect()).waiting == 1
    await lock.release(lease)


async def test_a_lapsed_holder_and_place_of_a_mode_are_left_out(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    rw = ReadWriteLock(redis_backend, "doc", ttl=10)
    reader = await rw.read.acquire()
    holders, held, _, places = mode_keys("rw", "doc").keys[:4]
    now = await _now_ms(redis_client)
    # A reader whose lease ran out (no script has pruned it yet) and a dead waiter.
    await redis_client.zadd(holders, {"gone": (now - 1000) * 1000})
    await redis_client.hset(held, "gone", "1:7")
    await redis_client.zadd(places, {"dead:10000:": now - 1000})
    state = await rw.inspect()
    assert [(h.fence, h.mode) for h in state.holders] == [(reader.fence, "read")]
    assert state.waiting == 0
    await rw.read.release(reader)
