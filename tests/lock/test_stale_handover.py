"""A lease that is nearly spent when its hold starts is renewed first, not lost at once.

A lease handed over to a waiter counts from the waiter's last refused attempt, which may
be most of a TTL before the hand-over. ``hold()`` (and everything holding through
``Renewal`` or ``fresh_sync``: elections, ``locked``, ``MultiLock``, the sync twins)
renews such a lease before its block runs; a renewal the store refuses is ``LockLost``.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import redis
from redis import asyncio as aioredis

from headway import (
    FakeClock,
    Lease,
    Lock,
    LockLost,
    MemoryLockBackend,
    MultiLock,
    RedisLockBackend,
    SyncElection,
    SyncLock,
    SyncMultiLock,
    SyncRedisLockBackend,
    current_lease,
    locked,
)
from headway.lock.backends.redis.keys import lock_keys

pytestmark = pytest.mark.anyio


class LateGrants(MemoryLockBackend):
    """Its grants reach their caller ``late`` s after they were asked for, on its
    ``FakeClock``: as a lease handed over after a long wait, the store counting too."""

    def __init__(self, clock: FakeClock, late: float) -> None:
        super().__init__(clock)
        self.fake = clock
        self.late = late
        self.extends = 0

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        lease = await super().acquire(resource, ttl, timeout)
        self.fake.advance(self.late)
        return lease

    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        self.extends += 1
        return await super()._extend(resource, token, ttl_ms)


async def test_hold_renews_a_lease_with_less_than_renew_every_left() -> None:
    clock = FakeClock(100.0)
    backend = LateGrants(clock, late=2.9)  # 0.1 s left of 3: less than renew_every
    lock = Lock(backend, "r", ttl=3, clock=clock)
    async with lock.hold(renew_every=0.2) as lease:
        assert backend.extends == 1
        assert lease.remaining(clock()) == pytest.approx(3)
        # Past the deadline it was handed with, and past that lease's first renewal:
        # it was declared lost then, without a renewal being tried.
        clock.advance(0.5)
        await asyncio.sleep(0.15)
    await lock.release(await lock.acquire(timeout=0))  # released at the end


async def test_hold_of_a_lease_lapsed_before_the_block_is_lock_lost() -> None:
    clock = FakeClock(100.0)
    backend = LateGrants(clock, late=3.5)  # the store's lease ran out meanwhile
    lock = Lock(backend, "r", ttl=3, clock=clock)
    ran = False
    with pytest.raises(LockLost, match="lapsed before it was held"):
        async with lock.hold():
            ran = True
    assert not ran
    backend.late = 0
    await lock.release(await lock.acquire(timeout=0))


async def test_locked_and_multi_lock_renew_it_too() -> None:
    clock = FakeClock(100.0)
    backend = LateGrants(clock, late=2.9)  # renew_every: a third of the TTL, 1 s

    @locked(backend, "job", ttl=3)
    async def job() -> float:
        return current_lease().remaining(clock())

    assert await job() == pytest.approx(3)
    assert backend.extends == 1
    backend.late = 1.2  # "a" has 0.6 s left when the hold starts (renewed), "b" 1.8 s
    async with MultiLock(backend, ["a", "b"], ttl=3, clock=clock).hold() as leases:
        assert [lease.remaining(clock()) for lease in leases] == pytest.approx([3, 1.8])
    assert backend.extends == 2


async def test_multi_lock_hold_with_one_lapsed_lease_holds_none() -> None:
    clock = FakeClock(100.0)
    backend = LateGrants(clock, late=2.0)  # "a" lapses while "b" is acquired
    multi = MultiLock(backend, ["a", "b"], ttl=3, clock=clock)
    with pytest.raises(LockLost, match="'a' lapsed"):
        async with multi.hold():
            pytest.fail("the block ran")
    backend.late = 0
    await multi.release(await multi.acquire(timeout=0))  # "b" was released


async def test_a_redis_hand_over_after_most_of_the_ttl_is_renewed_before_the_block(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    # The waiter is on another client (another process): the lock is handed to it in
    # Redis; its lease counts from its last refused attempt, about 0.35 s before.
    other = aioredis.Redis.from_url(redis_url)
    holding, waiting = RedisLockBackend(redis_client), RedisLockBackend(other)
    holder, waiter_lock = Lock(holding, "r", ttl=0.6), Lock(waiting, "r", ttl=0.6)
    left_at_entry: list[float] = []

    async def hold() -> None:
        async with waiter_lock.hold(renew_every=0.45) as lease:
            left_at_entry.append(lease.remaining())
            await asyncio.sleep(0.5)  # past the deadline it was handed with

    try:
        held = await holder.acquire()
        waiter = asyncio.create_task(hold())
        async with asyncio.timeout(5):
            while not await redis_client.zcard(lock_keys("r").queue):
                await asyncio.sleep(0.001)
        # Retried every 0.5 s (WAIT_CAP): released before the waiter tries again.
        await asyncio.sleep(0.35)
        await holder.release(held)
        async with asyncio.timeout(5):
            await waiter  # no LockLost
        assert left_at_entry[0] > 0.45
    finally:
        await holding.aclose()
        await waiting.aclose()
        await other.aclose()


class SyncHandsOverLate(SyncRedisLockBackend):
    """Its leases count from an attempt most of a TTL ago, as a hand-over's may."""

    def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        lease = super().acquire(resource, ttl, timeout)
        return dataclasses.replace(lease, deadline=lease.deadline - 0.9 * ttl)


def test_the_sync_holds_renew_it_too(sync_redis_client: redis.Redis) -> None:
    backend = SyncHandsOverLate(sync_redis_client)
    try:
        with SyncLock(backend, "r", ttl=5).hold() as lease:
            assert lease.remaining() > 4
        with SyncMultiLock(backend, ["a", "b"], ttl=5).hold() as leases:
            assert min(lease.remaining() for lease in leases) > 4
        with SyncElection(backend, "jobs", ttl=5).campaign() as leadership:
            assert leadership.lease.remaining() > 4
            assert leadership.leading
    finally:
        backend.close()
