"""Who holds a lock (``inspect``) over every backend that can tell (``needs("inspect")``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from headway import Lease, Lock, LockState, SyncLock
from headway.lock.contract import (
    LockBackend,
    ModalLockBackend,
    SyncLockBackend,
    SyncModalLockBackend,
)
from headway.lock.introspection import check_owner, owned_by, owner_of
from headway.lock.lease import new_token
from headway.lock.shared import ReadWriteLock, Semaphore, SyncReadWriteLock, SyncSemaphore
from tests.lock.test_modes import queued
from tests.lock.test_sync_modes import queued as queued_in_thread
from tests.lock.toy_backend import ToyLockBackend

pytestmark = pytest.mark.anyio


@pytest.mark.needs("inspect")
async def test_a_free_lock_has_no_holders(lock_backend: LockBackend) -> None:
    state = await Lock(lock_backend, "report").inspect()
    assert state == LockState("report")
    assert not state.held


@pytest.mark.needs("inspect")
async def test_the_holder_its_fence_and_time_left(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "nightly-report", ttl=10, owner="worker-3:pid-41")
    lease = await lock.acquire()
    state = await lock.inspect()
    [holder] = state.holders
    assert (holder.fence, holder.mode) == (lease.fence, "exclusive")
    assert holder.expires_in is None or 0 < holder.expires_in <= 10
    # The token releases the lock: whoever inspects must not learn it.
    assert lease.token.rpartition(".")[2] not in repr(state)
    await lock.release(lease)
    assert not (await lock.inspect()).held


@pytest.mark.needs("inspect", "owner")
async def test_the_holder_is_named_by_its_owner(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "nightly-report", ttl=10, owner="worker-3:pid-41")
    anonymous = Lock(lock_backend, "other-report", ttl=10)
    lease, other = await lock.acquire(), await anonymous.acquire()
    assert [h.owner for h in (await lock.inspect()).holders] == ["worker-3:pid-41"]
    assert [h.owner for h in (await anonymous.inspect()).holders] == [None]
    await lock.release(lease)
    await anonymous.release(other)


@pytest.mark.needs("inspect", "line")
async def test_anonymous_holders_and_waiters_are_counted(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "busy", ttl=10, timeout=10)
    held = await lock.acquire()
    waiters = [await queued(lock, lock.acquire) for _ in range(2)]
    state = await lock.inspect()
    assert [h.owner for h in state.holders] == [None]
    assert state.waiting == 2
    await lock.release(held)
    for waiter in waiters:
        await lock.release(await waiter)
    assert await lock.inspect() == LockState("busy")


@pytest.mark.needs("inspect")
async def test_readers_and_a_waiting_writer(modal_backend: ModalLockBackend) -> None:
    rw = ReadWriteLock(modal_backend, "doc", ttl=10, timeout=10, owner="reader")
    readers = [await rw.read.acquire(), await rw.read.acquire()]
    writer = await queued(rw.write, rw.write.acquire)
    state = await rw.inspect()
    assert [(h.fence, h.mode, h.owner) for h in state.holders] == [
        (lease.fence, "read", "reader") for lease in sorted(readers, key=lambda r: r.fence)
    ]
    assert state.waiting == 1
    for reader in readers:
        await rw.read.release(reader)
    lease = await writer
    assert [(h.fence, h.mode) for h in (await rw.inspect()).holders] == [(lease.fence, "write")]
    await rw.write.release(lease)


@pytest.mark.needs("inspect")
async def test_a_semaphores_permit_holders(modal_backend: ModalLockBackend) -> None:
    semaphore = Semaphore(modal_backend, "pool", permits=2, ttl=10, owner="pooled")
    leases = [await semaphore.acquire() for _ in range(2)]
    state = await semaphore.inspect()
    assert sorted(h.fence for h in state.holders) == sorted(lease.fence for lease in leases)
    assert {(h.mode, h.owner) for h in state.holders} == {("permits", "pooled")}
    for lease in leases:
        await semaphore.release(lease)


async def test_a_backend_that_cannot_tell_says_so() -> None:
    with pytest.raises(TypeError, match="cannot tell who holds a lock"):
        await Lock(ToyLockBackend(), "x").inspect()
    with pytest.raises(TypeError, match="cannot tell who holds a lock"):
        SyncLock(object(), "x").inspect()  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "two words", "x" * 65, "tab\there", "é"])
def test_bad_owners_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="owner"):
        check_owner(bad)
    with pytest.raises(TypeError):
        check_owner(3)  # type: ignore[arg-type]


def test_owners_ride_in_tokens_and_nothing_else_parses_as_one() -> None:
    assert owner_of(new_token()) is None
    with owned_by("host-a:17"):
        token = new_token()
    assert owner_of(token) == "host-a:17"
    assert len(token.rpartition(".")[2]) == 32  # the random part is whole
    assert owner_of(new_token()) is None  # the context ended
    for foreign in ["zz.0123", "ab.", ".abc", "c3a9.00", "20.00", "a.b.c"]:
        assert owner_of(foreign) is None, foreign


# -- the sync shells -------------------------------------------------------------------------


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def sync_queued(
    pool: ThreadPoolExecutor, lock: SyncLock, start: Callable[[], Lease]
) -> Future[Lease]:
    """Start ``start()`` in a thread and return once its request holds a place in line."""
    if hasattr(lock.backend, "_attempt"):
        return queued_in_thread(pool, lock, start)
    # A server that keeps the line itself (MySQL): the line is server state, polled.
    before = lock.inspect().waiting
    future = pool.submit(start)
    deadline = time.monotonic() + 10
    while lock.inspect().waiting <= before:
        assert not future.done(), "the request was answered instead of queued"
        assert time.monotonic() < deadline, "the request never queued"
        time.sleep(0.005)
    return future


@pytest.mark.needs("inspect", "line")
def test_sync_holder_owner_and_waiters(
    sync_lock_backend: SyncLockBackend, pool: ThreadPoolExecutor
) -> None:
    lock = SyncLock(sync_lock_backend, "nightly", ttl=10, timeout=10, owner="cron-1")
    assert lock.inspect() == LockState("nightly")
    lease = lock.acquire()
    waiter = sync_queued(pool, lock, lock.acquire)
    state = lock.inspect()
    [holder] = state.holders
    assert (holder.fence, holder.mode) == (lease.fence, "exclusive")
    assert holder.expires_in is None or 0 < holder.expires_in <= 10
    assert state.waiting == 1
    lock.release(lease)
    lock.release(waiter.result(10))
    assert lock.inspect() == LockState("nightly")


@pytest.mark.needs("inspect", "owner")
def test_sync_holder_is_named_by_its_owner(sync_lock_backend: SyncLockBackend) -> None:
    lock = SyncLock(sync_lock_backend, "nightly", ttl=10, owner="cron-1")
    lease = lock.acquire()
    assert [h.owner for h in lock.inspect().holders] == ["cron-1"]
    lock.release(lease)


@pytest.mark.needs("inspect")
def test_sync_readers_writer_and_permits(
    sync_modal_backend: SyncModalLockBackend, pool: ThreadPoolExecutor
) -> None:
    rw = SyncReadWriteLock(sync_modal_backend, "doc", ttl=10, timeout=10, owner="reader")
    readers = [rw.read.acquire(), rw.read.acquire()]
    writer = sync_queued(pool, rw.write, rw.write.acquire)
    state = rw.inspect()
    assert [(h.fence, h.mode, h.owner) for h in state.holders] == [
        (lease.fence, "read", "reader") for lease in sorted(readers, key=lambda r: r.fence)
    ]
    assert state.waiting == 1
    for reader in readers:
        rw.read.release(reader)
    lease = writer.result(10)
    assert [(h.fence, h.mode) for h in rw.inspect().holders] == [(lease.fence, "write")]
    rw.write.release(lease)
    semaphore = SyncSemaphore(sync_modal_backend, "pool", permits=2, ttl=10)
    permits = [semaphore.acquire() for _ in range(2)]
    assert sorted(h.fence for h in semaphore.inspect().holders) == sorted(p.fence for p in permits)
    assert {h.mode for h in semaphore.inspect().holders} == {"permits"}
    for permit in permits:
        semaphore.release(permit)
    assert not semaphore.inspect().held
