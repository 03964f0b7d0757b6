"""Riders (async): a task asking for a Redis lock one of its own backend's tasks holds
rides on the holder's release instead of sending a script of its own."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from redis import asyncio as aioredis

from headway import Lock, LockNotAcquired, LockNotOwned, RedisLockBackend
from headway.lock.backends.redis.keys import LEAVE, leave_call, lock_keys
from tests.lock.backends.redis.waiters import queue_raw_waiter, ridden, subscribed, two_riders
from tests.servers import RedisServers

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["first waiter", "channel subscribed"])
async def riding(
    request: pytest.FixtureRequest, redis_backend: RedisLockBackend
) -> AsyncIterator[RedisLockBackend]:
    """The backend, and how its riders ride: the first waiter of a resource goes through
    subscribes to the channel after its first attempt; once other tasks listen, a rider
    joins them before its first attempt (``_join``, no I/O). A listener that waits for
    nothing keeps the channel subscribed for the second case."""
    if request.param == "first waiter":
        yield redis_backend
        return
    async with subscribed(redis_backend, "ride"):
        yield redis_backend


async def test_riders_take_one_script_per_grant_in_fifo_order(
    redis_servers: RedisServers,
) -> None:
    server = redis_servers.start()
    client = aioredis.Redis(port=server.port)
    backend = RedisLockBackend(client)
    lock = Lock(backend, "ride", ttl=10, timeout=30)
    await lock.release(await lock.acquire())  # scripts cached, connection open
    grants: list[int] = []
    inside = 0

    async def worker(n: int) -> None:
        nonlocal inside
        for _ in range(50):
            lease = await lock.acquire()
            inside += 1
            assert inside == 1
            grants.append(n)
            await asyncio.sleep(0)  # the others ask meanwhile: they ride
            inside -= 1
            await lock.release(lease)

    await client.config_resetstat()
    await asyncio.gather(*(worker(n) for n in range(8)))
    calls = {k: v["calls"] for k, v in (await client.info("commandstats")).items()}
    # Every acquire but the first few rides on a release: one script per grant (plus
    # the few first attempts made before anybody held the lock).
    assert calls["cmdstat_fcall"] <= len(grants) + 16
    assert sorted(grants.count(n) for n in range(8)) == [50] * 8
    # FIFO: once all eight are in, each grant goes to the task that waited longest.
    assert all(len(set(grants[i : i + 8])) == 8 for i in range(8, len(grants) - 8, 8))
    await backend.aclose()
    await client.aclose()
    redis_servers.stop(server)


async def test_a_rider_goes_behind_a_waiter_queued_before_it(
    riding: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    backend = riding
    lock = Lock(backend, "ride", ttl=30, timeout=10)
    held = await lock.acquire()
    earlier = await queue_raw_waiter(redis_client, "ride", "a" * 32)  # another process's
    rider = asyncio.create_task(lock.acquire())
    await ridden(backend)
    assert not rider.done()
    k = lock_keys("ride")
    assert await redis_client.zrange(k.queue, 0, -1) == [earlier.encode()]  # not queued yet
    await lock.release(held)  # queues the rider behind it and hands the lock to `earlier`
    assert await redis_client.get(k.owner) == b"a" * 32
    assert await redis_client.zcard(k.queue) == 1
    await LEAVE.run(redis_client, *leave_call("ride", earlier))  # done: hands it on
    async with asyncio.timeout(2):
        lease = await rider
    assert lease.fence > held.fence
    await lock.release(lease)


async def test_a_rider_whose_holder_never_releases_gets_the_lock_after_the_lease(
    riding: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    backend = riding
    lock = Lock(backend, "ride", ttl=0.3, timeout=10)
    await lock.acquire()  # and never released: the holder "hangs"
    started = time.monotonic()
    lease = await Lock(backend, "ride", ttl=5, timeout=10).acquire()
    assert 0.25 < time.monotonic() - started < 0.3 + 1.0  # the lease, plus a bounded wait
    await lock.release(lease)


async def test_a_rider_that_gives_up_leaves_nothing_behind(
    riding: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    backend = riding
    lock = Lock(backend, "ride", ttl=30)
    held = await lock.acquire()
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0.2)  # rides, times out before any release
    cancelled = asyncio.create_task(lock.acquire(timeout=10))
    await ridden(backend)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await lock.release(held)  # queues nobody: neither rider is there to take it
    k = lock_keys("ride")
    assert await redis_client.exists(k.owner, k.queue, k.places) == 0
    async with asyncio.timeout(1):
        await lock.release(await lock.acquire(timeout=0))


async def test_riders_of_a_holder_that_lost_its_lease_try_for_themselves(
    riding: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    backend = riding
    lock = Lock(backend, "ride", ttl=30, timeout=10)
    held = await lock.acquire()
    rider = asyncio.create_task(lock.acquire())
    await ridden(backend)
    k = lock_keys("ride")
    await redis_client.set(k.owner, "somebody-else", px=300)  # our lease is gone
    with pytest.raises(LockNotOwned):
        await lock.release(held)  # queued nobody: the rider is told to try itself
    async with asyncio.timeout(2):  # within the other's lease and a bounded wait
        lease = await rider
    await lock.release(lease)


async def test_riders_behind_a_rider_of_ours_ride_on_its_release_outside_redis(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    # Nobody else waits: the release grants the first rider at once and leaves the second
    # to ride on the first's release. Neither ever enters the queue in Redis.
    lock = Lock(redis_backend, "left", ttl=30, timeout=10)
    async with subscribed(redis_backend, "left"):
        held, first, second = await two_riders(redis_backend, lock)
    await redis_client.config_resetstat()
    await lock.release(held)
    async with asyncio.timeout(2):
        one = await first
    assert not second.done()
    assert len(redis_backend._riders.held["left"].riders) == 1  # now riding on `one`
    await lock.release(one)
    async with asyncio.timeout(2):
        two = await second
    assert held.fence < one.fence < two.fence
    stats = await redis_client.info("commandstats")
    assert "cmdstat_zadd" not in stats, sorted(stats)
    await lock.release(two)


async def test_a_rider_left_to_us_that_gives_up_leaves_the_lock_free(
    redis_backend: RedisLockBackend,
) -> None:
    lock = Lock(redis_backend, "left", ttl=30, timeout=10)
    async with subscribed(redis_backend, "left"):
        held, first, second = await two_riders(redis_backend, lock)
    await lock.release(held)
    async with asyncio.timeout(2):
        one = await first
    second.cancel()  # it rides on `one`, outside Redis
    with contextlib.suppress(asyncio.CancelledError):
        await second
    await lock.release(one)
    await lock.release(await lock.acquire(timeout=0))  # free: nobody holds it for nothing
