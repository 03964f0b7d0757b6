"""``Lock.hold()``'s watchdog: started only once a renewal is due, then renewing or cancelling.

Short real windows with wide margins (a renewal every 0.25 s of a 1.5 s lease).
"""

from __future__ import annotations

import asyncio

import pytest
from redis import asyncio as aioredis

import headway
from headway.lock.backends.redis.keys import lock_keys

pytestmark = pytest.mark.anyio


class CountingBackend(headway.RedisLockBackend):
    extends = 0
    #: Set once ``extends`` reaches ``wanted`` (0: never).
    wanted = 0
    renewed_enough: asyncio.Event | None = None

    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        self.extends += 1
        renewed = await super()._extend(resource, token, ttl_ms)
        if self.extends == self.wanted and self.renewed_enough is not None:
            self.renewed_enough.set()
        return renewed


async def test_a_short_block_starts_no_watchdog_and_renews_nothing(
    redis_client: aioredis.Redis,
) -> None:
    backend = CountingBackend(redis_client)
    lock = headway.Lock(backend, "short", ttl=30)
    tasks = len(asyncio.all_tasks())
    async with lock.hold() as lease:
        assert len(asyncio.all_tasks()) == tasks
        assert await redis_client.get(lock_keys("short").owner) == lease.token.encode()
    assert await redis_client.exists(lock_keys("short").owner) == 0
    assert backend.extends == 0


async def test_a_long_block_keeps_its_lease_renewed(redis_client: aioredis.Redis) -> None:
    backend = CountingBackend(redis_client)
    # Renewals come at least 0.25 s apart, so the eighth comes 2 s or more after the
    # lease was taken: past its 1.5 s TTL, which only the renewals can have kept alive.
    backend.wanted, backend.renewed_enough = 8, asyncio.Event()
    lock = headway.Lock(backend, "long", ttl=1.5)
    async with lock.hold(renew_every=0.25) as lease:
        async with asyncio.timeout(10):
            await backend.renewed_enough.wait()
        assert await redis_client.get(lock_keys("long").owner) == lease.token.encode()
    # The block ends well within the 0.25 s before a ninth renewal would be due.
    assert backend.extends == 8
    assert await redis_client.exists(lock_keys("long").owner) == 0


async def test_a_lease_taken_away_cancels_the_block(redis_client: aioredis.Redis) -> None:
    lock = headway.Lock(CountingBackend(redis_client), "taken", ttl=1.5)
    reached_the_end = False

    async def block() -> None:
        nonlocal reached_the_end
        async with asyncio.timeout(10), lock.hold(renew_every=0.1):
            await redis_client.delete(lock_keys("taken").owner)  # as if it had expired
            await asyncio.sleep(5)
            reached_the_end = True

    with pytest.raises(headway.LockLost):
        await block()
    assert not reached_the_end
