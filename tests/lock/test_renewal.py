"""``Renewal``, the one lease watchdog, over any renew step and with or without a release."""

from __future__ import annotations

import asyncio

import pytest

from headway import LockLost, LockNotAcquired
from headway._clock import MonotonicClock
from headway.lock.contract import LockBackend
from headway.lock.lease import Lease
from headway.lock.renewal import Renewal

pytestmark = pytest.mark.anyio

#: Every backend counts its leases on the monotonic clock.
CLOCK = MonotonicClock()


async def test_without_a_release_the_lease_stays_with_its_owner(lock_backend: LockBackend) -> None:
    lease = await lock_backend.acquire("r", 5, 0)
    tasks = len(asyncio.all_tasks())
    async with Renewal(lease, lock_backend.extend, ttl=5, interval=1, clock=CLOCK) as held:
        assert held is lease
        assert len(asyncio.all_tasks()) == tasks  # a short block: a timer, no task
    with pytest.raises(LockNotAcquired):
        await lock_backend.acquire("r", 5, 0)
    await lock_backend.release(lease)


async def test_the_current_lease_follows_the_renewals(lock_backend: LockBackend) -> None:
    renewed: list[Lease] = []
    twice = asyncio.Event()

    async def renew(lease: Lease, ttl: float) -> Lease:
        renewed.append(await lock_backend.extend(lease, ttl))
        if len(renewed) == 2:
            twice.set()
        return renewed[-1]

    first = await lock_backend.acquire("r", 0.6, 0)
    renewal = Renewal(
        first, renew, ttl=0.6, interval=0.1, clock=CLOCK, release=lock_backend.release
    )
    async with asyncio.timeout(5), renewal:
        await twice.wait()
        assert renewal.lease == renewed[-1]
        assert renewal.lease.deadline > first.deadline
        assert renewal.lease.token == first.token
    await lock_backend.release(await lock_backend.acquire("r", 5, 0))  # released at the end


async def test_a_lease_lapsed_unnoticed_is_lock_lost_at_a_clean_end(
    lock_backend: LockBackend,
) -> None:
    lease = await lock_backend.acquire("r", 5, 0)
    renewal = Renewal(
        lease, lock_backend.extend, ttl=5, interval=1, clock=CLOCK, release=lock_backend.release
    )
    with pytest.raises(LockLost, match="lapsed while held"):
        async with renewal:
            await lock_backend.release(lease)  # gone before any renewal could notice


async def test_a_lease_lapsed_under_an_error_leaves_the_error(lock_backend: LockBackend) -> None:
    lease = await lock_backend.acquire("r", 5, 0)
    renewal = Renewal(
        lease, lock_backend.extend, ttl=5, interval=1, clock=CLOCK, release=lock_backend.release
    )
    with pytest.raises(KeyError):
        async with renewal:
            await lock_backend.release(lease)
            raise KeyError("the block's own error")
