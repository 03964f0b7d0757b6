"""Concurrency slots are a semaphore's permits: one state, one lease lifecycle.

A limiter's names are its own (``slot_key``), so a ``Semaphore`` never meets its slots.
These tests make the names coincide (a semaphore view whose holders key is the slot
key) to show they are then one lock: a permit of either counts against the other, a
slot's release hands a permit to a queued semaphore waiter, and a slot is never taken
ahead of a waiter. On Redis they also take the scripts' rare branches: the short
release and renewal answered -1 while somebody waits, then sent whole.
"""

from __future__ import annotations

import asyncio
import functools

import pytest
from redis import asyncio as aioredis

from headway import (
    Concurrency,
    ConcurrencyLimiter,
    Lock,
    LockNotAcquired,
    MemoryRateLimitBackend,
    RedisLockBackend,
    RedisRateLimitBackend,
)
from headway.lock.backends.memory_modes import MemoryModeBackend
from headway.lock.backends.redis.mode_keys import ModeCalls, family_keys
from headway.lock.contract import LockBackend
from headway.lock.lease import Lease
from headway.lock.modes import permits
from headway.ratelimit.slots import PERMIT_FENCE, slot_key

pytestmark = pytest.mark.anyio

POLICY = Concurrency(3, ttl=10.0)


async def _waiting(task: asyncio.Task[Lease]) -> None:
    for _ in range(200):  # its first attempt was refused and queued it
        await asyncio.sleep(0.005)
    assert not task.done()


async def _one_lock(
    limiter: ConcurrencyLimiter, semaphore: LockBackend, key: str, resource: str
) -> None:
    """``limiter``'s slots on ``key`` and ``semaphore``'s permits on ``resource`` (which
    names the same state) are one lock of three permits."""
    first, second = await limiter.acquire(key), await limiter.acquire(key)
    assert (first.in_flight, second.in_flight) == (1, 2)
    permit = await Lock(semaphore, resource, ttl=10, timeout=0).acquire()
    assert permit.fence > PERMIT_FENCE  # a semaphore's permit is fenced, a slot is not
    refused = await limiter.acquire(key)
    assert (refused.allowed, refused.in_flight) == (False, 3)
    assert 9 < refused.retry_after <= 10
    with pytest.raises(LockNotAcquired):
        await Lock(semaphore, resource, ttl=10, timeout=0).acquire()

    waiter = asyncio.create_task(Lock(semaphore, resource, ttl=10, timeout=10).acquire())
    await _waiting(waiter)
    assert second.slot is not None
    assert (await limiter.extend(second.slot)).token == second.slot.token  # renewed, waiter queued
    assert await limiter.release(first)  # the waiter is handed the permit...
    handed = await asyncio.wait_for(waiter, 5)
    assert handed.fence > permit.fence
    assert not (await limiter.acquire(key)).allowed  # ...not a slot taken meanwhile

    for lease in (permit, handed):
        await Lock(semaphore, resource, ttl=10, timeout=0).release(lease)
    assert await limiter.release(second)
    assert (await limiter.acquire(key)).in_flight == 1


async def test_in_memory_a_slot_and_a_semaphore_permit_are_one_lock() -> None:
    backend = MemoryRateLimitBackend()
    limiter = ConcurrencyLimiter(POLICY, backend=backend, budget=5)
    # A semaphore over the limiter's own families (a MemoryLockBackend has its own),
    # on the resource named as the slots are.
    view = MemoryModeBackend(backend._store.slots, permits(POLICY.limit))
    await _one_lock(limiter, view, "k", slot_key("k", POLICY))


@pytest.mark.redis
async def test_on_redis_a_slot_and_a_semaphore_permit_are_one_lock(
    redis_client: aioredis.Redis,
) -> None:
    backend = RedisRateLimitBackend(redis_client)
    limiter = ConcurrencyLimiter(POLICY, backend=backend, budget=5)
    locks = RedisLockBackend(redis_client)
    view = locks.for_mode(permits(POLICY.limit))
    view._calls = ModeCalls(permits(POLICY.limit), False, functools.partial(_slot, POLICY))
    try:
        await _one_lock(limiter, view, "k", "k")
        keys = {k.decode() for k in await redis_client.keys("*")}  # type: ignore[union-attr]
        family = family_keys(slot_key("k", POLICY)).keys
        # The slot left; the semaphore's fence counter stays, as any semaphore's does.
        assert keys == {family[0], family[5]}
    finally:
        await locks.aclose()
        await backend.aclose()


def _slot(policy: Concurrency, key: str) -> str:
    return slot_key(key, policy)
