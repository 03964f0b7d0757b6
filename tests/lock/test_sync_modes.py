"""``SyncReadWriteLock`` and ``SyncSemaphore`` over every entry of ``SYNC_LOCK_BACKENDS``
(conftest) that offers ``modes``, with threads; the refusal of every entry that lacks them."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from headway import Lease, LockNotAcquired, LockNotOwned, SyncLock
from headway.lock import flow
from headway.lock.backends.blocking import BlockingLockBackend
from headway.lock.contract import SyncModalLockBackend
from headway.lock.shared import SyncReadWriteLock, SyncSemaphore
from tests.lock.conftest import SYNC_LOCK_BACKENDS

WAIT = 10.0  # the longest any step of a test may take on a loaded machine

#: The entries of the shared table that offer no modes: each must refuse them.
WITHOUT_MODES = [name for name, entry in SYNC_LOCK_BACKENDS.items() if "modes" in entry.lacks]


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=16) as executor:
        yield executor


@pytest.fixture
def woken_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiters are not retried within the test's bound: only a release wakes them."""
    monkeypatch.setattr(flow, "WAIT_CAP", 60.0)


def queued(pool: ThreadPoolExecutor, lock: SyncLock, start: Callable[[], Lease]) -> Future[Lease]:
    """Start ``start()`` in a thread and return once its request holds a place in line
    (its first attempt, refused, queued it).

    Sync queued backends are watched through the driver's ``_attempt``; a twin over an
    async backend (``BlockingLockBackend``) through its async backend's ``_attempt``, or
    else (a server that keeps the line) its ``waiting(resource)``, which must rise.
    """
    backend: Any = lock.backend
    if isinstance(backend, BlockingLockBackend):
        if not hasattr(backend.backend, "_attempt"):
            return _queued_by_count(pool, lock, start)
        return _queued_on_loop(pool, backend, start)
    refused = threading.Event()
    original = backend._attempt
    # Only the new request's thread counts: a waiter queued earlier retries too.
    ours = threading.local()

    def watched(*args: Any) -> Any:
        attempt = original(*args)
        if not attempt.granted and getattr(ours, "flag", False):
            refused.set()
        return attempt

    def marked() -> Lease:
        ours.flag = True
        try:
            return start()
        finally:
            ours.flag = False  # the pool's thread serves the next request

    backend._attempt = watched
    try:
        future = pool.submit(marked)
        _wait_for(refused, future)
    finally:
        backend._attempt = original
    return future


def _wait_for(refused: threading.Event, future: Future[Lease]) -> None:
    deadline = time.monotonic() + WAIT
    while not refused.wait(0.01):
        assert not future.done(), "the request was answered instead of queued"
        assert time.monotonic() < deadline, "the request never queued"
    assert not future.done()


def _queued_on_loop(
    pool: ThreadPoolExecutor, twin: BlockingLockBackend, start: Callable[[], Lease]
) -> Future[Lease]:
    # The attempts run on the twin's loop, in a copy of the calling thread's context.
    inner: Any = twin.backend
    refused = threading.Event()
    original = inner._attempt
    ours = contextvars.ContextVar("ours", default=False)

    async def watched(*args: Any) -> Any:
        attempt = await original(*args)
        if not attempt.granted and ours.get():
            refused.set()
        return attempt

    def marked() -> Lease:
        ours.set(True)
        try:
            return start()
        finally:
            ours.set(False)

    inner._attempt = watched
    try:
        future = pool.submit(marked)
        _wait_for(refused, future)
    finally:
        inner._attempt = original
    return future


def _queued_by_count(
    pool: ThreadPoolExecutor, lock: SyncLock, start: Callable[[], Lease]
) -> Future[Lease]:
    # The line is server state, with no event to wait for: polled.
    twin: Any = lock.backend

    def waiting() -> int:
        return int(twin._loop.run(twin.backend.waiting(lock.resource)))

    before = waiting()
    future = pool.submit(start)
    deadline = time.monotonic() + WAIT
    while waiting() <= before:
        assert not future.done(), "the request was answered instead of queued"
        assert time.monotonic() < deadline, "the request never queued"
        time.sleep(0.005)
    assert not future.done()
    return future


def test_readers_share_and_a_writer_is_alone(sync_modal_backend: SyncModalLockBackend) -> None:
    rw = SyncReadWriteLock(sync_modal_backend, "doc", ttl=10, timeout=0)
    first, second = rw.read.acquire(), rw.read.acquire()
    with pytest.raises(LockNotAcquired):
        rw.write.acquire()
    rw.read.release(first)
    rw.read.release(second)
    writer = rw.write.acquire()
    with pytest.raises(LockNotAcquired):
        rw.read.acquire()
    with pytest.raises(LockNotAcquired):
        rw.write.acquire()
    rw.write.release(writer)
    reader = rw.read.acquire()
    assert first.fence < second.fence < writer.fence < reader.fence
    rw.read.release(reader)


@pytest.mark.usefixtures("woken_only")
def test_a_waiting_writer_stops_later_readers(
    sync_modal_backend: SyncModalLockBackend, pool: ThreadPoolExecutor
) -> None:
    rw = SyncReadWriteLock(sync_modal_backend, "doc", ttl=30, timeout=30)
    reader = rw.read.acquire()
    writer_future = queued(pool, rw.write, rw.write.acquire)
    with pytest.raises(LockNotAcquired):
        rw.read.acquire(timeout=0)
    late = [queued(pool, rw.read, rw.read.acquire) for _ in range(2)]
    rw.read.release(reader)
    writer = writer_future.result(WAIT)
    assert not any(future.done() for future in late)
    rw.write.release(writer)
    # Readers queued together behind the writer enter together: both are woken.
    leases = [future.result(WAIT) for future in late]
    assert all(lease.fence > writer.fence > reader.fence for lease in leases)
    for lease in leases:
        rw.read.release(lease)


def test_readers_and_writers_never_overlap_counted(
    sync_modal_backend: SyncModalLockBackend, pool: ThreadPoolExecutor
) -> None:
    rw = SyncReadWriteLock(sync_modal_backend, "counted", ttl=10, timeout=30)
    guard = threading.Lock()
    inside = {"read": 0, "write": 0}
    entered = {"read": 0, "write": 0}
    overlaps: list[str] = []
    writer_fences: list[int] = []

    def worker(i: int) -> None:
        for round_ in range(6):
            kind = "write" if (i + round_) % 4 == 0 else "read"
            lock = rw.write if kind == "write" else rw.read
            lease = lock.acquire()
            with guard:
                inside[kind] += 1
                entered[kind] += 1
                if inside["write"] > 1 or (inside["write"] and inside["read"]):
                    overlaps.append(f"{kind} {lease.fence}: {inside}")
                if kind == "write":
                    writer_fences.append(lease.fence)
            time.sleep(0.002)  # the section: others must not enter a writer's
            with guard:
                inside[kind] -= 1
            lock.release(lease)

    for future in [pool.submit(worker, i) for i in range(8)]:
        future.result(60)
    assert overlaps == []
    assert entered == {"write": 12, "read": 36}
    assert writer_fences == sorted(writer_fences)


def test_semaphore_grants_its_permits_then_refuses(
    sync_modal_backend: SyncModalLockBackend,
) -> None:
    semaphore = SyncSemaphore(sync_modal_backend, "pool", permits=3, ttl=10, timeout=0)
    leases = [semaphore.acquire() for _ in range(3)]
    assert leases[0].fence < leases[1].fence < leases[2].fence
    with pytest.raises(LockNotAcquired):
        semaphore.acquire()
    semaphore.release(leases[0])
    fourth = semaphore.acquire()
    assert fourth.fence > leases[2].fence
    with pytest.raises(LockNotOwned):
        semaphore.release(leases[0])
    for lease in [*leases[1:], fourth]:
        semaphore.release(lease)


@pytest.mark.usefixtures("woken_only")
def test_semaphore_waiters_are_served_in_arrival_order(
    sync_modal_backend: SyncModalLockBackend, pool: ThreadPoolExecutor
) -> None:
    semaphore = SyncSemaphore(sync_modal_backend, "pool", permits=2, ttl=30, timeout=30)
    held = [semaphore.acquire(), semaphore.acquire()]
    futures = [queued(pool, semaphore, semaphore.acquire) for _ in range(4)]
    for lease in held:
        semaphore.release(lease)
    first_two = [futures[0].result(WAIT), futures[1].result(WAIT)]
    assert first_two[0].fence < first_two[1].fence
    assert not futures[2].done()
    assert not futures[3].done()
    for lease in first_two:
        semaphore.release(lease)
    last_two = [futures[2].result(WAIT), futures[3].result(WAIT)]
    assert first_two[1].fence < last_two[0].fence < last_two[1].fence
    for lease in last_two:
        semaphore.release(lease)


def test_semaphore_permits_can_change_without_losing_holders(
    sync_modal_backend: SyncModalLockBackend,
) -> None:
    two = SyncSemaphore(sync_modal_backend, "pool", permits=2, ttl=10, timeout=0)
    held = [two.acquire(), two.acquire()]
    three = SyncSemaphore(sync_modal_backend, "pool", permits=3, ttl=10, timeout=0)
    held.append(three.acquire())
    one = SyncSemaphore(sync_modal_backend, "pool", permits=1, ttl=10, timeout=0)
    with pytest.raises(LockNotAcquired):
        one.acquire()
    for lease in held[:2]:
        two.release(lease)
    with pytest.raises(LockNotAcquired):
        one.acquire()
    one.release(held[2])
    one.release(one.acquire())


def test_semaphore_counted_exactly(
    sync_modal_backend: SyncModalLockBackend, pool: ThreadPoolExecutor
) -> None:
    semaphore = SyncSemaphore(sync_modal_backend, "counted", permits=3, ttl=10, timeout=30)
    guard = threading.Condition()
    inside = most = entered = 0

    def worker() -> None:
        nonlocal inside, most, entered
        for _ in range(5):
            with semaphore.hold():
                with guard:
                    inside += 1
                    entered += 1
                    most = max(most, inside)
                    guard.notify_all()
                    # Until three are inside at once, holders stay: on a slow backend
                    # (etcd) a 2 ms section alone ended before the third was granted.
                    guard.wait_for(lambda: most == 3, timeout=WAIT)  # noqa: B023 - the shared count
                time.sleep(0.002)
                with guard:
                    inside -= 1

    for future in [pool.submit(worker) for _ in range(8)]:
        future.result(60)
    assert entered == 40
    assert most == 3


def test_a_timed_out_waiter_leaves_no_place_in_line(
    sync_modal_backend: SyncModalLockBackend,
) -> None:
    rw = SyncReadWriteLock(sync_modal_backend, "doc", ttl=10, timeout=30)
    semaphore = SyncSemaphore(sync_modal_backend, "pool", permits=1, ttl=10, timeout=30)
    writer, permit = rw.write.acquire(), semaphore.acquire()
    for lock in (rw.read, rw.write, semaphore):
        with pytest.raises(LockNotAcquired):
            lock.acquire(timeout=0.05)
    rw.write.release(writer)
    semaphore.release(permit)
    # Nobody is left ahead: requests that do not wait are granted at once.
    rw.write.release(rw.write.acquire(timeout=0))
    semaphore.release(semaphore.acquire(timeout=0))


@pytest.mark.parametrize("name", WITHOUT_MODES)
def test_a_backend_without_modes_is_refused_at_construction(
    name: str, request: pytest.FixtureRequest
) -> None:
    # The real backends the table says lack modes, made as the shared suites make them.
    with SYNC_LOCK_BACKENDS[name].make(request) as backend:
        refused = rf"the {name} lock backend does not offer {{}} \(it offers modes: none"
        with pytest.raises(ValueError, match=refused.format("read-write locks")):
            SyncReadWriteLock(backend, "doc")
        with pytest.raises(ValueError, match=refused.format("semaphores")):
            SyncSemaphore(backend, "pool", permits=2)
