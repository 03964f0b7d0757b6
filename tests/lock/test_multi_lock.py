"""``MultiLock``: several names all or nothing, in sorted order, over every async backend
in ``LOCK_BACKENDS`` (conftest); ``SyncMultiLock`` over every ``SYNC_LOCK_BACKENDS`` entry."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from headway import (
    Lease,
    Lock,
    LockBackend,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    MemoryLockBackend,
    MultiLock,
    SyncLockBackend,
    SyncMultiLock,
)

pytestmark = pytest.mark.anyio

#: Rounds per caller of the crossed-order test: 1,000 each, but 200 on etcd
#: (~40 lock cycles/s through its JSON gateway: 1,000 would take ~45 s), to keep CI short.
ROUNDS = {"etcd": 200}
#: The same for the sync test. Its PostgreSQL, Redlock, etcd and ZooKeeper entries are the
#: async backends behind the sync twins' private loop, crossed 1,000 times (etcd 200) by
#: the async test: fewer rounds here keep the new entries' cost to seconds.
SYNC_ROUNDS = {"etcd": 100, "zookeeper": 200, "postgres": 200, "redlock": 200}


def _rounds(request: pytest.FixtureRequest, table_fixture: str) -> int:
    backend_name = request.node.callspec.params[table_fixture]
    table = SYNC_ROUNDS if table_fixture.startswith("sync") else ROUNDS
    return table.get(backend_name, 1000)


async def test_crossed_orders_never_deadlock_and_exclude(
    lock_backend: LockBackend, request: pytest.FixtureRequest
) -> None:
    rounds = _rounds(request, "lock_backend")
    inside = 0
    overlaps = 0
    done = {"ab": 0, "ba": 0}

    async def caller(order: str) -> None:
        nonlocal inside, overlaps
        lock = MultiLock(lock_backend, list(order), ttl=10, timeout=30)
        for _ in range(rounds):
            async with lock.hold():
                inside += 1
                overlaps += inside > 1
                await asyncio.sleep(0)
                inside -= 1
                done[order] += 1

    async with asyncio.timeout(240), asyncio.TaskGroup() as tg:
        tg.create_task(caller("ab"))
        tg.create_task(caller("ba"))
    assert overlaps == 0
    assert done == {"ab": rounds, "ba": rounds}


async def test_names_are_sorted_and_deduplicated_and_exclude_single_locks(
    lock_backend: LockBackend,
) -> None:
    lock = MultiLock(lock_backend, ["b", "a", "b"], ttl=10)
    assert lock.names == ("a", "b")
    leases = await lock.acquire(timeout=0)
    assert [lease.resource for lease in leases] == ["a", "b"]
    with pytest.raises(LockNotAcquired):
        await Lock(lock_backend, "b").acquire(timeout=0)
    await lock.release(leases)
    await MultiLock(lock_backend, ["a", "b"]).release(await lock.acquire(timeout=0))


async def test_a_partial_set_is_released_when_the_rest_is_busy(lock_backend: LockBackend) -> None:
    other = await lock_backend.acquire("b", 10, 0)
    lock = MultiLock(lock_backend, ["a", "b", "c"], ttl=10)
    with pytest.raises(LockNotAcquired) as caught:
        await lock.acquire(timeout=0)
    assert caught.value.resource == "b"
    await lock_backend.release(await lock_backend.acquire("a", 10, 0))  # "a" let go
    await lock_backend.release(other)
    await lock.release(await lock.acquire(timeout=0))


async def test_the_timeout_bounds_the_whole_set(lock_backend: LockBackend) -> None:
    first = await lock_backend.acquire("a", 10, 0)
    second = await lock_backend.acquire("b", 10, 0)

    async def free_a_later() -> None:
        await asyncio.sleep(0.4)
        await lock_backend.release(first)

    lock = MultiLock(lock_backend, ["a", "b"], ttl=10)
    started = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(free_a_later())
        with pytest.raises(LockNotAcquired) as caught:
            await lock.acquire(timeout=0.8)  # "a" after 0.4 s, then 0.4 s left for "b"
    elapsed = time.monotonic() - started
    assert caught.value.resource == "b"
    assert 0.7 < elapsed < 1.5  # not 0.4 + 0.8
    await lock_backend.release(await lock_backend.acquire("a", 10, 0))  # "a" let go
    await lock_backend.release(second)


async def test_a_cancelled_acquire_releases_what_it_took(lock_backend: LockBackend) -> None:
    other = await lock_backend.acquire("b", 10, 0)
    lock = MultiLock(lock_backend, ["a", "b"], ttl=10)
    task = asyncio.create_task(lock.acquire(timeout=30))
    await asyncio.sleep(0.3)  # it holds "a" and waits for "b"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await lock_backend.release(await lock_backend.acquire("a", 10, 0))
    await lock_backend.release(other)


async def test_losing_any_lease_cancels_the_block(lock_backend: LockBackend) -> None:
    lock = MultiLock(lock_backend, ["a", "b"], ttl=0.6)
    reached_end = False
    thief: list[Lease] = []
    with pytest.raises(LockLost) as caught:
        async with asyncio.timeout(5), lock.hold(renew_every=0.1) as leases:
            await lock_backend.release(leases[1])  # someone else takes "b" over
            thief.append(await lock_backend.acquire("b", 5, 0))
            await asyncio.Event().wait()
            reached_end = True
    assert not reached_end
    assert caught.value.resource == "b"
    await lock_backend.release(await lock_backend.acquire("a", 10, 0))  # "a" released too
    await lock_backend.release(thief[0])


async def test_release_tries_every_lease_then_raises(lock_backend: LockBackend) -> None:
    lock = MultiLock(lock_backend, ["a", "b", "c"], ttl=10)
    leases = await lock.acquire(timeout=0)
    await lock_backend.release(leases[0])  # "a" lapsed, as it were
    with pytest.raises(LockNotOwned) as caught:
        await lock.release(leases)
    assert caught.value.resource == "a"
    await lock.release(await lock.acquire(timeout=0))  # "b" and "c" were released


async def test_held_leases_are_renewed_during_a_long_wait() -> None:
    backend = MemoryLockBackend()
    other = await backend.acquire("b", 10, 0)

    async def free_b_later() -> None:
        await asyncio.sleep(1.0)
        await backend.release(other)

    lock = MultiLock(backend, ["a", "b"], ttl=0.4)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(free_b_later())
        leases = await lock.acquire(timeout=5)  # "a" (0.4 s lease) held through a 1 s wait
    assert all(lease.remaining() > 0 for lease in leases)
    await lock.release(leases)


def test_bad_names_are_refused() -> None:
    backend = MemoryLockBackend()
    with pytest.raises(TypeError, match="not one str"):
        MultiLock(backend, "ab")
    with pytest.raises(ValueError, match="must not be empty"):
        MultiLock(backend, [])
    with pytest.raises(TypeError, match="must be a str"):
        MultiLock(backend, ["a", 1])  # type: ignore[list-item]


# -- sync -------------------------------------------------------------------------------


def test_sync_crossed_orders_never_deadlock_and_exclude(
    sync_lock_backend: SyncLockBackend, request: pytest.FixtureRequest
) -> None:
    rounds = _rounds(request, "sync_lock_backend")
    inside = [0]
    overlaps = [0]
    done = {"ab": 0, "ba": 0}

    def caller(order: str) -> None:
        lock = SyncMultiLock(sync_lock_backend, list(order), ttl=10, timeout=30)
        for _ in range(rounds):
            with lock.hold():
                inside[0] += 1
                overlaps[0] += inside[0] > 1
                time.sleep(0)
                inside[0] -= 1
                done[order] += 1

    threads = [threading.Thread(target=caller, args=(order,)) for order in ("ab", "ba")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
        assert not thread.is_alive(), "deadlocked"
    assert overlaps[0] == 0
    assert done == {"ab": rounds, "ba": rounds}


def test_sync_partial_set_released_and_lost_lease_reported(
    sync_lock_backend: SyncLockBackend,
) -> None:
    other = sync_lock_backend.acquire("b", 10, 0)
    lock = SyncMultiLock(sync_lock_backend, ["b", "a"], ttl=0.6)
    with pytest.raises(LockNotAcquired):
        lock.acquire(timeout=0)
    sync_lock_backend.release(sync_lock_backend.acquire("a", 10, 0))
    sync_lock_backend.release(other)
    with pytest.raises(LockLost), lock.hold(renew_every=0.1) as leases:
        sync_lock_backend.release(leases[0])
        thief = sync_lock_backend.acquire("a", 5, 0)
        time.sleep(0.3)
    sync_lock_backend.release(thief)
    sync_lock_backend.release(sync_lock_backend.acquire("b", 10, 0))  # released at the end
