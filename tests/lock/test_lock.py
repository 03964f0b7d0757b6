"""One suite over every queued backend (memory, Redis): the lock's contract."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import pytest

from headway import Lease, Lock, LockBackend, LockLost, LockNotAcquired, LockNotOwned
from headway.lock import flow as _flow
from headway.lock.flow import Try
from headway.lock.lease import new_token

pytestmark = pytest.mark.anyio


async def test_acquire_release(backend: LockBackend) -> None:
    lock = Lock(backend, "orders/1", ttl=5)
    lease = await lock.acquire(timeout=0)
    assert lease.resource == "orders/1"
    assert 4 < lease.remaining() <= 5
    await lock.release(lease)
    await lock.release(await lock.acquire(timeout=0))


async def test_held_lock_is_exclusive(backend: LockBackend) -> None:
    lock = Lock(backend, "r", ttl=5)
    lease = await lock.acquire(timeout=0)
    with pytest.raises(LockNotAcquired) as caught:
        await lock.acquire(timeout=0)
    assert caught.value.resource == "r"
    await lock.release(lease)


async def test_every_acquire_gets_its_own_lease(backend: LockBackend) -> None:
    lock = Lock(backend, "r", ttl=5)
    first = await lock.acquire()
    await lock.release(first)
    second = await lock.acquire()
    assert second.token != first.token
    assert second.fence > first.fence
    # The old lease cannot release the new one.
    with pytest.raises(LockNotOwned):
        await lock.release(first)
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0)
    await lock.release(second)


async def test_a_retried_attempt_gets_the_same_grant(backend: LockBackend) -> None:
    # redis-py retries a command whose reply was lost: the script runs twice.
    step = Try(new_token(), 5000, "", 2000)
    first = await backend._try("r", step)  # type: ignore[attr-defined]
    again = await backend._try("r", step)  # type: ignore[attr-defined]
    assert first.granted
    assert again == first
    other = await backend._try("r", Try(new_token(), 5000, "", 2000))  # type: ignore[attr-defined]
    assert not other.granted


async def test_expired_lease_cannot_release_or_extend_the_next_holder(
    backend: LockBackend,
) -> None:
    lock = Lock(backend, "r", ttl=0.1)
    stale = await lock.acquire()
    await asyncio.sleep(0.25)  # let the lease run out (real time, wide margin)
    fresh = await lock.acquire(timeout=0, ttl=5)
    with pytest.raises(LockNotOwned):
        await lock.release(stale)
    with pytest.raises(LockNotOwned):
        await lock.extend(stale)
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0)
    await lock.release(fresh)


async def test_extend_keeps_the_lock_past_its_ttl(backend: LockBackend) -> None:
    lock = Lock(backend, "r", ttl=0.2)
    lease = await lock.acquire()
    extended = await lock.extend(lease, ttl=5)
    assert extended.token == lease.token
    assert extended.fence == lease.fence
    assert extended.deadline > lease.deadline
    await asyncio.sleep(0.35)
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0)
    await lock.release(extended)


async def test_mutual_exclusion_and_fence_order_counted(backend: LockBackend) -> None:
    lock = Lock(backend, "counter", ttl=5, timeout=30)
    counter = 0
    fences: list[int] = []

    async def worker() -> None:
        nonlocal counter
        for _ in range(25):
            lease = await lock.acquire()
            value = counter
            await asyncio.sleep(0)  # invite a race: only the lock prevents a lost update
            counter = value + 1
            fences.append(lease.fence)
            await lock.release(lease)

    await asyncio.gather(*(worker() for _ in range(8)))
    assert counter == 200
    assert fences == sorted(fences)
    assert len(set(fences)) == 200


async def test_waiter_is_woken_by_release_not_by_polling(
    backend: LockBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With waits capped at 60 s, only a wake-up lets the waiter in before the
    # test's 5 s timeout: a polling waiter (or a lost wake-up) fails this test.
    monkeypatch.setattr(_flow, "WAIT_CAP", 60.0)
    lock = Lock(backend, "r", ttl=30)
    holder = await lock.acquire()
    tries = 0
    queued = asyncio.Event()
    original = backend._attempt  # type: ignore[attr-defined]

    async def counting_try(*args: Any) -> Any:
        nonlocal tries
        tries += 1
        result = await original(*args)
        queued.set()
        return result

    backend._attempt = counting_try  # type: ignore[attr-defined]
    waiter = asyncio.create_task(lock.acquire(timeout=30))
    await queued.wait()
    await lock.release(holder)
    async with asyncio.timeout(5):
        lease = await waiter
    # The failed attempt, at most one retry after subscribing, the granted attempt.
    assert tries <= 3
    await lock.release(lease)


async def test_waiters_are_served_first_come_first_served(backend: LockBackend) -> None:
    lock = Lock(backend, "fifo", ttl=30, timeout=30)
    holder = await lock.acquire()
    order: list[int] = []
    queued = [asyncio.Event() for _ in range(5)]

    async def waiter(i: int) -> None:
        lease = await lock.acquire()
        order.append(i)
        await lock.release(lease)

    original = backend._attempt  # type: ignore[attr-defined]
    tasks = []
    for i in range(5):
        # Start the next waiter only once the previous one holds its place in line.
        async def tracked(*args: Any, i: int = i) -> Any:
            result = await original(*args)
            queued[i].set()
            return result

        backend._attempt = tracked  # type: ignore[attr-defined]
        tasks.append(asyncio.create_task(waiter(i)))
        await queued[i].wait()
    backend._attempt = original  # type: ignore[attr-defined]
    await lock.release(holder)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]


async def test_contention_gives_every_worker_a_fair_share(backend: LockBackend) -> None:
    lock = Lock(backend, "fair", ttl=5, timeout=30)
    wins: Counter[int] = Counter()
    total = 400

    async def worker(i: int) -> None:
        while sum(wins.values()) < total:
            lease = await lock.acquire()
            wins[i] += 1
            await asyncio.sleep(0)
            await lock.release(lease)

    await asyncio.gather(*(worker(i) for i in range(8)))
    shares = [wins[i] / sum(wins.values()) for i in range(8)]
    assert min(shares) >= 0.08, wins


async def test_timeout_gives_up_and_leaves_no_place_in_line(backend: LockBackend) -> None:
    lock = Lock(backend, "r", ttl=30)
    holder = await lock.acquire()
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0.2)
    await lock.release(holder)
    # A waiter still queued would make a single attempt fail (it would go first).
    await lock.release(await lock.acquire(timeout=0))


async def test_cancelled_waiter_leaves_no_place_in_line(backend: LockBackend) -> None:
    lock = Lock(backend, "r", ttl=30)
    holder = await lock.acquire()
    waiter = asyncio.create_task(lock.acquire(timeout=10))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await lock.release(holder)
    await lock.release(await lock.acquire(timeout=0))


@pytest.mark.parametrize("yields", range(6))
async def test_cancel_during_acquire_strands_nothing(backend: LockBackend, yields: int) -> None:
    lock = Lock(backend, "r", ttl=30)
    task = asyncio.create_task(lock.acquire(timeout=0))
    for _ in range(yields):
        await asyncio.sleep(0)
    task.cancel()
    try:
        lease = await task
    except asyncio.CancelledError:
        pass
    else:  # it completed before the cancellation landed: then we own it
        await lock.release(lease)
    await lock.release(await lock.acquire(timeout=0))


# From one yield on: a task cancelled before its first step never started releasing.
@pytest.mark.parametrize("yields", range(1, 7))
async def test_cancel_during_release_still_releases(backend: LockBackend, yields: int) -> None:
    lock = Lock(backend, "r", ttl=30)
    lease = await lock.acquire()
    task = asyncio.create_task(lock.release(lease))
    for _ in range(yields):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await lock.release(await lock.acquire(timeout=0))


async def test_hold_renews_past_the_ttl(backend: LockBackend) -> None:
    lock = Lock(backend, "r", ttl=0.6)
    async with lock.hold(renew_every=0.1) as lease:
        await asyncio.sleep(1.5)  # 2.5 TTLs: only renewals keep it
        with pytest.raises(LockNotAcquired):
            await lock.acquire(timeout=0)
    await lock.release(await lock.acquire(timeout=0))
    assert lease.ttl == 0.6


async def test_lost_lease_cancels_the_block_and_raises_lock_lost(backend: LockBackend) -> None:
    lock = Lock(backend, "r", ttl=0.6)
    reached_end = False
    never = asyncio.Event()
    thief: Lease | None = None
    with pytest.raises(LockLost) as caught:
        async with asyncio.timeout(5):
            async with lock.hold(renew_every=0.1) as lease:
                # Someone else takes over (as after an expiry): the lease is gone.
                await backend.release(lease)
                thief = await lock.acquire(timeout=0)
                await never.wait()
                reached_end = True
    assert not reached_end
    assert caught.value.resource == "r"
    assert thief is not None
    await lock.release(thief)  # the thief's lease was not touched by the loser


async def test_max_hold_caps_the_hold(backend: LockBackend) -> None:
    lock = Lock(backend, "r", ttl=0.2)
    with pytest.raises(LockLost, match="max_hold"):
        async with asyncio.timeout(5):
            async with lock.hold(renew_every=0.05, max_hold=0.4):
                await asyncio.Event().wait()
    await lock.release(await lock.acquire(timeout=1, ttl=5))  # free again (ttl: no race)


async def test_hold_releases_when_the_block_raises(backend: LockBackend) -> None:
    lock = Lock(backend, "r", ttl=5)
    with pytest.raises(KeyError):
        async with lock.hold():
            raise KeyError("boom")
    await lock.release(await lock.acquire(timeout=0))


async def test_outside_cancellation_of_a_hold_is_not_lock_lost(backend: LockBackend) -> None:
    lock = Lock(backend, "r", ttl=5)
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


async def test_bad_arguments_raise_value_error(backend: LockBackend) -> None:
    with pytest.raises(ValueError, match="ttl"):
        Lock(backend, "r", ttl=0)
    with pytest.raises(ValueError, match="timeout"):
        Lock(backend, "r", timeout=-1)
    lock = Lock(backend, "r", ttl=1)
    with pytest.raises(ValueError, match="renew_every"):
        lock.hold(renew_every=1)
    with pytest.raises(ValueError, match="timeout"):
        await lock.acquire(timeout=10**9)
    with pytest.raises(TypeError):
        Lock(backend, None)  # type: ignore[arg-type]
