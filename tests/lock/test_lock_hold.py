"""``Lock.hold()`` over every async backend in ``LOCK_BACKENDS`` (conftest): renewal,
``LockLost`` on loss, release on the way out."""

from __future__ import annotations

import asyncio

import pytest

from headway import Lease, Lock, LockBackend, LockLost, LockNotAcquired

pytestmark = pytest.mark.anyio


async def test_hold_renews_past_the_ttl(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "r", ttl=0.6)
    async with lock.hold(renew_every=0.1) as lease:
        await asyncio.sleep(1.5)  # 2.5 TTLs: only renewals keep it
        with pytest.raises(LockNotAcquired):
            await lock.acquire(timeout=0)
    await lock.release(await lock.acquire(timeout=0))
    assert lease.ttl == 0.6


async def test_lost_lease_cancels_the_block_and_raises_lock_lost(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "r", ttl=0.6)
    reached_end = False
    never = asyncio.Event()
    thief: Lease | None = None
    with pytest.raises(LockLost) as caught:
        async with asyncio.timeout(5):
            async with lock.hold(renew_every=0.1) as lease:
                # Someone else takes over (as after an expiry): the lease is gone.
                await lock_backend.release(lease)
                thief = await lock.acquire(timeout=0)
                await never.wait()
                reached_end = True
    assert not reached_end
    assert caught.value.resource == "r"
    assert thief is not None
    await lock.release(thief)  # the thief's lease was not touched by the loser


async def test_max_hold_caps_the_hold(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "r", ttl=0.2)
    with pytest.raises(LockLost, match="max_hold"):
        async with asyncio.timeout(5):
            async with lock.hold(renew_every=0.05, max_hold=0.4):
                await asyncio.Event().wait()
    await lock.release(await lock.acquire(timeout=1, ttl=5))  # free again (ttl: no race)


async def test_hold_releases_when_the_block_raises(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "r", ttl=5)
    with pytest.raises(KeyError):
        async with lock.hold():
            raise KeyError("boom")
    await lock.release(await lock.acquire(timeout=0))


async def test_outside_cancellation_of_a_hold_is_not_lock_lost(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "r", ttl=5)
    inside = asyncio.Event()

    async def holder() -> None:
        async with lock.hold():
            inside.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(holder())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await lock.release(await lock.acquire(timeout=0))
