"""Many locks at once: N async workers, each on its own key, one client and one loop.

Nothing is contended; this is the throughput of an app taking many different
locks concurrently, where headway's own connection lets concurrent calls share
writes and reads, and a lock that sends each command alone cannot.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from _lock_subjects import TTL, _AsyncFloor, _PlainAsync
from redis import asyncio as aioredis

import headway

Cycle = Callable[[], Awaitable[None]]


def _headway(own_connection: bool) -> Callable[[Any, list[str]], list[Cycle]]:
    def make(client: Any, keys: list[str]) -> list[Cycle]:
        backend = headway.RedisLockBackend(client, own_connection=own_connection)

        def cycle_for(key: str) -> Cycle:
            lock = headway.Lock(backend, key, ttl=TTL)

            async def cycle() -> None:
                await lock.release(await lock.acquire(timeout=0))

            return cycle

        return [cycle_for(k) for k in keys]

    return make


def _redis_py(client: Any, keys: list[str]) -> list[Cycle]:
    def cycle_for(key: str) -> Cycle:
        async def cycle() -> None:
            lock = _PlainAsync(client.lock(key, timeout=TTL))
            await lock.acquire()
            await lock.release()

        return cycle

    return [cycle_for(k) for k in keys]


def _floor(client: Any, keys: list[str]) -> list[Cycle]:
    floor = _AsyncFloor(client)

    async def cycle() -> None:
        await floor.acquire()
        await floor.release()

    return [cycle] * len(keys)


MANY = {
    "floor async": _floor,
    "headway async": _headway(True),
    "headway async, own_connection=False": _headway(False),
    "redis-py asyncio Lock": _redis_py,
}


async def many_keys(url: str, name: str, workers: int, seconds: float) -> float:
    """Cycles per second of ``workers`` concurrent acquire + release loops on distinct keys."""
    client = aioredis.Redis.from_url(url)
    run = uuid.uuid4().hex
    cycles = MANY[name](client, [f"bench:{run}:{i}" for i in range(workers)])
    for cycle in cycles:  # warm up: scripts cached, connections open
        await cycle()
    done = 0
    stop = time.monotonic() + seconds

    async def loop(cycle: Cycle) -> None:
        nonlocal done
        while time.monotonic() < stop:
            await cycle()
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(loop(c) for c in cycles))
    rate = done / (time.monotonic() - started)
    await client.aclose()
    return rate
