"""Slots as leases of the lock primitive: the lock contract, ``LockLost``, round trips."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis
from redis import asyncio as aioredis

from headway import (
    Admission,
    Concurrency,
    ConcurrencyBackend,
    ConcurrencyLimiter,
    Lock,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisRateLimitBackend,
    SyncConcurrencyLimiter,
    SyncLock,
    SyncMemoryRateLimitBackend,
    SyncRedisRateLimitBackend,
)
from headway.ratelimit.slots import PERMIT_FENCE
from tests.servers import Server

pytestmark = pytest.mark.anyio


async def test_a_lost_slot_lease_cancels_the_hold_block(slot_backend: ConcurrencyBackend) -> None:
    limiter = ConcurrencyLimiter(Concurrency(1, ttl=0.3), backend=slot_backend)
    entered = asyncio.Event()
    held: list[Admission] = []

    async def block() -> None:
        async with limiter.hold("k") as admission:
            held.append(admission)
            entered.set()
            await asyncio.Event().wait()  # only the watchdog ends this

    task = asyncio.create_task(block())
    await entered.wait()
    assert await limiter.release(held[0])  # the lease ends under the holder's feet
    with pytest.raises(LockLost) as lost:
        await task
    assert lost.value.resource == "k"
    assert isinstance(lost.value.__cause__, LockNotOwned)
    assert (await limiter.acquire("k")).allowed  # nothing left behind


async def test_permits_keep_the_lock_backend_contract(slot_backend: ConcurrencyBackend) -> None:
    limiter = ConcurrencyLimiter(Concurrency(2, ttl=5.0), backend=slot_backend)
    lock = Lock(limiter.permits, "k", ttl=5.0, timeout=0)
    first, second = await lock.acquire(), await lock.acquire()
    assert (first.resource, first.fence, first.ttl) == ("k", PERMIT_FENCE, 5.0)
    assert first.token != second.token
    with pytest.raises(LockNotAcquired, match="2 of 2 permits"):
        await lock.acquire()
    longer = await lock.extend(first, 60.0)
    assert (longer.token, longer.ttl) == (first.token, 60.0)
    assert longer.deadline > first.deadline
    await lock.release(longer)
    with pytest.raises(LockNotOwned):
        await lock.release(first)
    with pytest.raises(LockNotOwned):
        await lock.extend(first)
    await lock.release(second)
    for bad in ({"timeout": 1.0}, {"ttl": 4.0}):
        with pytest.raises(ValueError, match="at once"):
            await lock.acquire(**bad)


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_sync_permits_keep_the_lock_backend_contract(
    kind: str, sync_redis_client: redis.Redis
) -> None:
    backend = (
        SyncMemoryRateLimitBackend()
        if kind == "memory"
        else SyncRedisRateLimitBackend(sync_redis_client)
    )
    limiter = SyncConcurrencyLimiter(Concurrency(1, ttl=5.0), backend=backend)
    lock = SyncLock(limiter.permits, "sync", ttl=5.0, timeout=0)
    lease = lock.acquire()
    assert lease.fence == PERMIT_FENCE
    with pytest.raises(LockNotAcquired):
        lock.acquire()
    assert lock.extend(lease).deadline > lease.deadline
    lock.release(lease)
    with pytest.raises(LockNotOwned):
        lock.release(lease)
    with pytest.raises(LockNotOwned):
        lock.extend(lease)


@pytest.fixture
async def own_client(own_server: Server) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(own_server.url)
    await client.flushall()  # our own throw-away server
    yield client
    await client.aclose()


async def _scripts_run(client: aioredis.Redis) -> int:
    stats = (await client.info("commandstats")).get("cmdstat_fcall", {})
    # A call that found no function (its library loaded on the same call) failed.
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


@pytest.mark.redis
async def test_a_hold_costs_one_script_to_take_one_to_give_back_and_one_per_renewal(
    own_client: aioredis.Redis,
) -> None:
    backend = RedisRateLimitBackend(own_client)
    limiter = ConcurrencyLimiter(Concurrency(1, ttl=1.5), backend=backend, budget=5)
    try:
        async with limiter.hold("warm"):  # connect, load the scripts
            pass
        await own_client.config_resetstat()
        async with limiter.hold("k"):  # shorter than a third of the TTL: no renewal
            pass
        assert await _scripts_run(own_client) == 2
        await own_client.config_resetstat()
        async with limiter.hold("k"):
            await asyncio.sleep(0.75)  # renewed once, at a third of the TTL (0.5 s)
        assert await _scripts_run(own_client) == 3
    finally:
        await backend.aclose()
