"""``SyncLock``'s contract, over every sync backend in ``SYNC_LOCK_BACKENDS`` (conftest)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from headway import LockLost, LockNotAcquired, LockNotOwned, SyncLock
from headway.lock.contract import SyncLockBackend


def test_sync_acquire_extend_release(sync_lock_backend: SyncLockBackend) -> None:
    sync_lock = SyncLock(sync_lock_backend, "sync", ttl=5)
    lease = sync_lock.acquire(timeout=0)
    assert lease.resource == "sync"
    assert 4 < lease.remaining() <= 5
    with pytest.raises(LockNotAcquired):
        sync_lock.acquire(timeout=0)
    lease = sync_lock.extend(lease, ttl=10)
    assert 9 < lease.remaining() <= 10
    sync_lock.release(lease)
    with pytest.raises(LockNotOwned):
        sync_lock.release(lease)
    again = sync_lock.acquire(timeout=0)
    assert again.token != lease.token
    assert again.fence > lease.fence
    sync_lock.release(again)


@pytest.mark.needs("short_ttl")
def test_sync_expired_lease_cannot_touch_the_next_holder(
    sync_lock_backend: SyncLockBackend,
) -> None:
    lock = SyncLock(sync_lock_backend, "sync", ttl=0.1)
    stale = lock.acquire()
    time.sleep(0.25)  # let the lease run out (real time, wide margin)
    fresh = lock.acquire(timeout=0, ttl=5)
    with pytest.raises(LockNotOwned):
        lock.release(stale)
    with pytest.raises(LockNotOwned):
        lock.extend(stale)
    with pytest.raises(LockNotAcquired):
        lock.acquire(timeout=0)
    lock.release(fresh)


def test_sync_timeout_gives_up_and_leaves_no_place_in_line(
    sync_lock_backend: SyncLockBackend,
) -> None:
    lock = SyncLock(sync_lock_backend, "sync", ttl=30)
    holder = lock.acquire()
    started = time.monotonic()
    with pytest.raises(LockNotAcquired):
        lock.acquire(timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 0.2 + 1.0
    lock.release(holder)
    lock.release(lock.acquire(timeout=0))


def test_sync_threads_exclude_each_other_and_are_woken(sync_lock_backend: SyncLockBackend) -> None:
    sync_lock = SyncLock(sync_lock_backend, "sync", ttl=5)
    counter = 0
    fences: list[int] = []

    def worker() -> None:
        nonlocal counter
        for _ in range(20):
            lease = sync_lock.acquire(timeout=30)
            value = counter
            time.sleep(0.0005)  # widen the race window: only the lock protects it
            counter = value + 1
            fences.append(lease.fence)
            sync_lock.release(lease)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter == 120
    assert fences == sorted(fences)
    assert len(set(fences)) == 120  # so strictly increasing, grant after grant


def test_sync_hold_renews(sync_lock_backend: SyncLockBackend) -> None:
    # A TTL well above a renewal's worst stall on a loaded 2-core machine (a 1.2 s TTL
    # lapsed once in CI beside a callgrind run), renewed every 0.1 s.
    lock = SyncLock(sync_lock_backend, "sync-hold", ttl=2.0)
    with lock.hold(renew_every=0.1):
        time.sleep(3.0)  # 1.5 TTLs: only renewals keep it (it would have lapsed 1 s ago)
        with pytest.raises(LockNotAcquired):
            lock.acquire(timeout=0)
    lock.release(lock.acquire(timeout=0))


def test_sync_hold_reports_a_lost_lease_when_the_block_ends(
    sync_lock_backend: SyncLockBackend,
) -> None:
    # The thief's lease (not renewed) must outlive the block by far, even on a loaded
    # machine (a 0.6 s TTL lapsed once in CI).
    lock = SyncLock(sync_lock_backend, "sync-hold", ttl=5.0)
    thief = None
    with pytest.raises(LockLost) as caught, lock.hold(renew_every=0.1) as lease:
        # Someone else takes over (as after an expiry): the next renewal is refused.
        sync_lock_backend.release(lease)
        thief = lock.acquire(timeout=0)
        time.sleep(0.4)
    assert caught.value.resource == "sync-hold"
    assert thief is not None
    lock.release(thief)  # the thief's lease was not touched by the loser


def test_sync_interrupted_acquire_leaves_nothing_behind(
    sync_lock_backend: SyncLockBackend,
) -> None:
    # SIGINT to the waiting (main) thread: KeyboardInterrupt, as Ctrl-C raises it there.
    lock = SyncLock(sync_lock_backend, "sync-interrupted", ttl=30)
    holder = lock.acquire(timeout=0)
    main = threading.main_thread().ident
    assert main == threading.get_ident()
    interrupter = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
    interrupter.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            lock.acquire(timeout=10)
    finally:
        interrupter.cancel()
    assert time.monotonic() - started < 5  # interrupted, not timed out
    lock.release(holder)
    # The interrupted waiter left its place (or, granted, released it): the lock is free.
    # Not at once on MySQL: KILL CONNECTION returns before the killed session has ended,
    # which may hold the lock for a moment (1 run in ~20). A waiter left behind would
    # hold it for its 30 s TTL.
    lock.release(lock.acquire(timeout=2))
