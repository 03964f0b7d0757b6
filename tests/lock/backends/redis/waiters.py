"""Waiters queued in Redis as another process would queue them, and riders of ours."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from redis import asyncio as aioredis

from headway import Lease, Lock, RedisLockBackend
from headway.lock.backends.redis.keys import ACQUIRE, acquire_call, lock_keys
from headway.lock.flow import Attempt, Try, waiter_id


async def queue_raw_waiter(client: aioredis.Redis, resource: str, token: str) -> str:
    """Queue a waiter as another process would, without anybody listening for it."""
    step = Try(token, 30_000, waiter_id(token, 30_000), 60_000)
    keys, args = acquire_call(resource, step)
    assert not Attempt.from_reply(await ACQUIRE.run(client, keys, args)).granted
    return step.waiter


async def ridden(backend: RedisLockBackend, resource: str = "ride", count: int = 1) -> None:
    """Return once ``count`` tasks ride on our holder of ``resource`` (bounded)."""
    async with asyncio.timeout(5):
        while len(backend._riders.held[resource].riders) < count:
            await asyncio.sleep(0.001)


async def two_riders(
    backend: RedisLockBackend, lock: Lock
) -> tuple[Lease, asyncio.Task[Lease], asyncio.Task[Lease]]:
    """``lock`` held by one task of ``backend``, and two more riding on it, in order."""
    held = await lock.acquire()
    first = asyncio.create_task(lock.acquire())
    await ridden(backend, lock.resource)
    second = asyncio.create_task(lock.acquire())
    await ridden(backend, lock.resource, 2)
    return held, first, second


@contextlib.asynccontextmanager
async def subscribed(backend: RedisLockBackend, resource: str) -> AsyncIterator[None]:
    """``resource``'s wake-up channel kept subscribed by a listener that waits for nothing:
    a rider then joins before its first attempt and never tries again after subscribing
    (an attempt that, sent as the holder releases, would find its grant itself)."""
    channel = lock_keys(resource).channel
    await backend._waker.listen(channel, "spectator")
    try:
        yield
    finally:
        await backend._waker.part(channel, "spectator")
