"""The lock's contract, over every async backend in ``LOCK_BACKENDS`` (conftest)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import pytest

from headway import Lock, LockBackend, LockNotAcquired, LockNotOwned
from tests.lock.conftest import LOCK_BACKENDS

pytestmark = pytest.mark.anyio


async def test_acquire_release(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "orders/1", ttl=5)
    lease = await lock.acquire(timeout=0)
    assert lease.resource == "orders/1"
    assert 4 < lease.remaining() <= 5
    await lock.release(lease)
    await lock.release(await lock.acquire(timeout=0))


async def test_held_lock_is_exclusive(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "r", ttl=5)
    lease = await lock.acquire(timeout=0)
    with pytest.raises(LockNotAcquired) as caught:
        await lock.acquire(timeout=0)
    assert caught.value.resource == "r"
    await lock.release(lease)


async def test_every_acquire_gets_its_own_lease(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "r", ttl=5)
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


async def test_tasks_sharing_a_lock_never_share_a_lease(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "shared", ttl=5, timeout=10)
    first = await lock.acquire()
    second_task = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)  # let it start waiting: it must not get the first task's lease
    assert not second_task.done()
    await lock.release(first)
    second = await second_task
    assert second.token != first.token
    assert second.fence > first.fence
    # The first task's lease is spent: it cannot release or extend the second's.
    with pytest.raises(LockNotOwned):
        await lock.release(first)
    with pytest.raises(LockNotOwned):
        await lock.extend(first)
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0)
    await lock.release(second)


@pytest.mark.needs("short_ttl")
async def test_expired_lease_cannot_release_or_extend_the_next_holder(
    lock_backend: LockBackend,
) -> None:
    lock = Lock(lock_backend, "r", ttl=0.1)
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


async def test_extend_keeps_the_lock_past_its_ttl(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "r", ttl=0.2)
    lease = await lock.acquire()
    extended = await lock.extend(lease, ttl=5)
    assert extended.token == lease.token
    assert extended.fence == lease.fence
    assert extended.deadline > lease.deadline
    await asyncio.sleep(0.35)
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0)
    await lock.release(extended)


async def test_mutual_exclusion_and_fence_order_counted(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "counter", ttl=5, timeout=30)
    counter = inside = most = 0
    fences: list[int] = []
    tokens: set[str] = set()

    async def worker() -> None:
        nonlocal counter, inside, most
        for _ in range(25):
            lease = await lock.acquire()
            inside += 1
            most = max(most, inside)
            tokens.add(lease.token)
            value = counter
            await asyncio.sleep(0)  # invite a race: only the lock prevents a lost update
            counter = value + 1
            fences.append(lease.fence)
            inside -= 1
            await lock.release(lease)

    await asyncio.gather(*(worker() for _ in range(8)))
    assert (counter, most) == (200, 1)
    assert fences == sorted(fences)
    assert len(set(fences)) == 200  # so strictly increasing, grant after grant
    assert len(tokens) == 200


@pytest.mark.needs("fair")
async def test_contention_gives_every_worker_a_fair_share(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "fair", ttl=5, timeout=30)
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


async def test_timeout_gives_up_and_leaves_no_place_in_line(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "r", ttl=30)
    holder = await lock.acquire()
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0.2)
    await lock.release(holder)
    # A waiter still queued would make a single attempt fail (it would go first).
    await lock.release(await lock.acquire(timeout=0))


async def test_cancelled_waiter_leaves_no_place_in_line(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "r", ttl=30)
    holder = await lock.acquire()
    waiter = asyncio.create_task(lock.acquire(timeout=10))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await lock.release(holder)
    await lock.release(await lock.acquire(timeout=0))


@pytest.mark.parametrize("yields", range(6))
async def test_cancel_during_acquire_strands_nothing(
    lock_backend: LockBackend, yields: int
) -> None:
    lock = Lock(lock_backend, "r", ttl=30)
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


async def _until_queued(lock: Lock, request: pytest.FixtureRequest) -> None:
    """Until a waiter is in ``lock``'s line, where the backend keeps one (events, no timer)."""
    name = request.node.callspec.params["lock_backend"]
    if {"inspect", "line"} & LOCK_BACKENDS[name].lacks.keys():
        await asyncio.sleep(0.005)  # no line to watch: the waiter retries in rounds
        return
    async with asyncio.timeout(5):
        while (await lock.inspect()).waiting == 0:
            await asyncio.sleep(0.001)


#: Hand-over races per backend: a cancellation 0 to 23 loop turns after the release
#: began, then 0 to 23 after it returned.
HANDOVER_RACES = [(turns, False) for turns in range(24)] + [(t, True) for t in range(24)]


async def test_a_waiter_cancelled_as_the_lock_is_handed_over_gets_no_lease(
    lock_backend: LockBackend, request: pytest.FixtureRequest
) -> None:
    # The contract: a cancelled acquire raises CancelledError and keeps no grant. Redis's
    # returned the handed lease when the cancellation came while it unsubscribed.
    holder = Lock(lock_backend, "handed", ttl=10)
    waiter_lock = Lock(lock_backend, "handed", ttl=10)
    cancelled = leases_returned = 0
    for turns, released in HANDOVER_RACES:
        held = await holder.acquire(timeout=5)
        waiter = asyncio.create_task(waiter_lock.acquire(timeout=5))
        await _until_queued(holder, request)
        releasing = asyncio.create_task(holder.release(held))
        if released:
            await releasing
        for _ in range(turns):
            await asyncio.sleep(0)
        if waiter.cancel():
            cancelled += 1
            try:
                lease = await waiter
            except asyncio.CancelledError:
                pass
            else:
                leases_returned += 1
                await waiter_lock.release(lease)
        else:
            await waiter_lock.release(waiter.result())
        await releasing
        # Nothing left behind: no grant, no place in the line (one attempt gets it).
        await holder.release(await holder.acquire(timeout=0))
    assert leases_returned == 0, f"{leases_returned} of {cancelled} cancelled acquires got a lease"
    assert cancelled > 0


# From one yield on: a task cancelled before its first step never started releasing.
@pytest.mark.parametrize("yields", range(1, 7))
async def test_cancel_during_release_still_releases(lock_backend: LockBackend, yields: int) -> None:
    lock = Lock(lock_backend, "r", ttl=30)
    lease = await lock.acquire()
    task = asyncio.create_task(lock.release(lease))
    for _ in range(yields):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await lock.release(await lock.acquire(timeout=0))


async def test_bad_arguments_raise_value_error(lock_backend: LockBackend) -> None:
    with pytest.raises(ValueError, match="ttl"):
        Lock(lock_backend, "r", ttl=0)
    with pytest.raises(ValueError, match="timeout"):
        Lock(lock_backend, "r", timeout=-1)
    lock = Lock(lock_backend, "r", ttl=1)
    with pytest.raises(ValueError, match="renew_every"):
        lock.hold(renew_every=1)
    with pytest.raises(ValueError, match="timeout"):
        await lock.acquire(timeout=10**9)
    with pytest.raises(TypeError):
        Lock(lock_backend, None)  # type: ignore[arg-type]


# What a backend owes the queue, seen through the public ``Lock`` alone: these run over a
# backend that implements ``LockBackend`` directly too, where test_queued.py cannot.

#: How long a waiter's request is given to reach the store before the next one asks. The
#: contract has no "in line" signal, so this is the one pause the FIFO test cannot avoid.
ARRIVAL = 0.25  # a loaded 2-core machine has taken more than 0.1 s


async def _reached_the_store(backend: LockBackend, resource: str, waiting: int) -> None:
    """Return once ``waiting`` requests are in the store's line: counted where the backend
    can say (``waiting``, e.g. PostgreSQL's ``pg_locks``), else after ``ARRIVAL``."""
    count = getattr(backend, "waiting", None)
    if count is None:
        await asyncio.sleep(ARRIVAL)
        return
    async with asyncio.timeout(10):
        while await count(resource) < waiting:
            await asyncio.sleep(0.005)  # server state with no event to wait for: polled


@pytest.mark.needs("fifo")
async def test_waiters_are_granted_in_the_order_they_asked(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "fifo", ttl=30, timeout=30)
    holder = await lock.acquire()
    asked = [asyncio.Event() for _ in range(4)]
    go_on = asyncio.Event()  # waiters keep the lock until the newcomer has asked
    granted: list[int] = []
    fences: list[int] = []

    async def waiter(i: int) -> None:
        asked[i].set()
        lease = await lock.acquire()
        granted.append(i)
        fences.append(lease.fence)
        await go_on.wait()
        await lock.release(lease)

    tasks = []
    for i in range(4):
        tasks.append(asyncio.create_task(waiter(i)))
        await asked[i].wait()
        await _reached_the_store(lock_backend, "fifo", i + 1)
    assert granted == []  # nobody got in past the holder
    await lock.release(holder)
    # A newcomer asking after the release comes after every waiter already in line.
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0)
    go_on.set()
    await asyncio.gather(*tasks)
    assert granted == [0, 1, 2, 3]
    assert fences == sorted(set(fences))  # strictly increasing, grant after grant
    assert fences[0] > holder.fence


@pytest.mark.needs("short_ttl")
async def test_a_lapsed_lease_lets_the_waiter_in_and_is_spent(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "r", ttl=0.2)
    stale = await lock.acquire()
    waited_from = asyncio.get_running_loop().time()
    # Never released: the waiter must get in when the lease runs out, long before its
    # timeout (a backend that waits for a release, or for the timeout, fails here).
    fresh = await lock.acquire(timeout=10, ttl=5)
    assert asyncio.get_running_loop().time() - waited_from < 5
    assert fresh.fence > stale.fence
    with pytest.raises(LockNotOwned):
        await lock.extend(stale)
    with pytest.raises(LockNotOwned):
        await lock.release(stale)
    with pytest.raises(LockNotAcquired):  # and the stale calls left the new holder alone
        await lock.acquire(timeout=0)
    await lock.release(fresh)


@pytest.mark.needs("short_ttl")
async def test_a_lapsed_lease_nobody_took_cannot_be_released_or_extended(
    lock_backend: LockBackend,
) -> None:
    lock = Lock(lock_backend, "r", ttl=0.1)
    stale = await lock.acquire()
    await asyncio.sleep(0.25)  # let the lease run out (real time, wide margin); nobody asks
    # No one took the lock over, but the lease is over all the same: renewing it would
    # hand its holder a lock the store already counted as free.
    with pytest.raises(LockNotOwned):
        await lock.extend(stale, ttl=5)
    with pytest.raises(LockNotOwned):
        await lock.release(stale)
    lease = await lock.acquire(timeout=0)
    assert lease.fence > stale.fence
    await lock.release(lease)
