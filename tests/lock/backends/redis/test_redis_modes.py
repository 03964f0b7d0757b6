"""Redis read-write locks and semaphores: the keys the server keeps, and for how long."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis
from redis import asyncio as aioredis

from headway import Lock, LockNotAcquired, RedisLockBackend, SyncRedisLockBackend
from headway.lock.backends.redis.mode_keys import mode_keys
from headway.lock.shared import ReadWriteLock, Semaphore, SyncReadWriteLock, SyncSemaphore
from tests.lock.test_modes import queued

pytestmark = pytest.mark.anyio

RW, PERMITS = mode_keys("rw", "doc").keys, mode_keys("permits", "pool").keys
# held, expiries (holders' keys) and the fence of each family; the queue's keys are 2..4.
HOLDING = {RW[0], RW[1], RW[5], PERMITS[0], PERMITS[1], PERMITS[5]}
FENCES = {RW[5], PERMITS[5]}


async def keys(client: aioredis.Redis) -> set[str]:
    return {key.decode() for key in await client.keys("*")}  # type: ignore[union-attr]


def sync_keys(client: redis.Redis) -> set[str]:
    return {key.decode() for key in client.keys("*")}  # type: ignore[union-attr]


@pytest.mark.parametrize("how", ["cancelled", "timed out"])
async def test_a_waiter_that_gives_up_leaves_no_key(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis, how: str
) -> None:
    rw = ReadWriteLock(redis_backend, "doc", ttl=10, timeout=30)
    semaphore = Semaphore(redis_backend, "pool", permits=1, ttl=10, timeout=30)
    writer, permit = await rw.write.acquire(), await semaphore.acquire()
    assert await keys(redis_client) == HOLDING
    locks = [rw.read, rw.write, semaphore]  # a reader, a writer, a permit
    if how == "cancelled":
        tasks = [await queued(lock, lock.acquire) for lock in locks]
        assert {RW[2], PERMITS[2]} <= await keys(redis_client)  # each holds a place
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    else:
        for lock in locks:
            with pytest.raises(LockNotAcquired):
                await lock.acquire(timeout=0.05)
    assert await keys(redis_client) == HOLDING
    await rw.write.release(writer)
    await semaphore.release(permit)
    assert await keys(redis_client) == FENCES


def test_a_timed_out_thread_leaves_no_key(
    sync_redis_backend: SyncRedisLockBackend, sync_redis_client: redis.Redis
) -> None:
    rw = SyncReadWriteLock(sync_redis_backend, "doc", ttl=10, timeout=0.05)
    semaphore = SyncSemaphore(sync_redis_backend, "pool", permits=1, ttl=10, timeout=0.05)
    writer, permit = rw.write.acquire(), semaphore.acquire()
    for lock in (rw.read, rw.write, semaphore):
        with pytest.raises(LockNotAcquired):
            lock.acquire()
    assert sync_keys(sync_redis_client) == HOLDING
    rw.write.release(writer)
    semaphore.release(permit)
    assert sync_keys(sync_redis_client) == FENCES


async def test_keys_live_as_long_as_the_last_lease(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    rw = ReadWriteLock(redis_backend, "doc", timeout=0)
    await rw.read.acquire(ttl=0.3)  # never released: its holder "crashed"
    long = await rw.read.acquire(ttl=5)
    assert 4000 < await redis_client.pttl(RW[0]) <= 5000
    await rw.read.release(long)
    # The holders' keys now live as long as the lease left, not the longest one granted.
    for key in RW[:2]:
        assert 0 < await redis_client.pttl(key) <= 300
    await asyncio.sleep(0.4)  # Redis expires them itself: no script runs meanwhile
    assert await keys(redis_client) == {RW[5]}
    # Idle and forgotten, the family's fences still rise.
    fence = (await rw.write.acquire()).fence
    assert fence > long.fence


async def test_a_place_keeps_the_queue_as_long_as_it_lasts(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    rw = ReadWriteLock(redis_backend, "doc", ttl=10, timeout=30)
    reader = await rw.read.acquire()
    waiter = await queued(rw.write, rw.write.acquire)
    for key in RW[2:5]:  # queue, places, wants: as long as a place (flow.PLACE_MS)
        assert 0 < await redis_client.pttl(key) <= 2000
    await rw.read.release(reader)
    await rw.write.release(await waiter)
    assert await keys(redis_client) == {RW[5]}


async def test_the_modes_keys_are_apart_from_the_exclusive_locks(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    async with Lock(redis_backend, "doc").hold(), ReadWriteLock(redis_backend, "doc").write.hold():
        exclusive = {k for k in await keys(redis_client) if k.startswith("headway:{lock:doc}")}
        assert exclusive
        assert not exclusive & set(RW)


async def test_a_waiter_cancelled_while_it_subscribes_is_cancelled(
    redis_client: aioredis.Redis,
) -> None:
    # redis-py's subscribe can swallow a cancellation that comes while it connects (the
    # waker lets it through): at any moment of the subscription, a cancelled waiter
    # stops, and leaves nothing behind.
    for turns in range(12):
        backend = RedisLockBackend(redis_client)
        locks = [Lock(backend, name, ttl=10, timeout=30) for name in ("a", "b")]
        held = [await lock.acquire() for lock in locks]
        tasks = [asyncio.create_task(lock.acquire()) for lock in locks]
        for _ in range(turns):
            await asyncio.sleep(0)
        tasks[0].cancel()
        async with asyncio.timeout(2):
            with contextlib.suppress(asyncio.CancelledError):
                await tasks[0]
        assert tasks[0].cancelled(), f"cancelled after {turns} turns, it went on"
        tasks[1].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tasks[1]
        for lock, lease in zip(locks, held, strict=True):
            await lock.release(lease)
        await backend.aclose()
