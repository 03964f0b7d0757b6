"""The sync twins' shell (``headway.lock.backends.blocking``): what the shared suites
(``test_sync_lock.py``, ``test_sync_modes.py``, ``test_safety.py``) do not reach.

The shell's own rules are tested over ``MemoryLockBackend`` (no server decides them);
calling from async code and bad URLs over the real twins.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

import pytest

from headway import (
    BackendUnavailable,
    Lease,
    LockNotAcquired,
    LockNotOwned,
    MemoryLockBackend,
    SyncLock,
    SyncPostgresLockBackend,
    SyncReadWriteLock,
    SyncRedlockBackend,
)
from headway.lock.backends.blocking import BlockingLockBackend, BlockingModalLockBackend


class _GrantedAnyway(MemoryLockBackend):
    """Its first acquire grants, then waits on ``gate``; cancelled meanwhile, it returns
    the lease anyway (as a backend whose grant raced the cancellation may)."""

    def __init__(self) -> None:
        super().__init__()
        self.granted = threading.Event()
        self.gate = asyncio.Event()

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        lease = await super().acquire(resource, ttl, timeout)
        if self.granted.is_set():
            return lease
        self.granted.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            return lease
        return lease


def _interrupt_main_when(event: threading.Event) -> threading.Thread:
    main = threading.main_thread().ident
    assert main == threading.get_ident()

    def interrupt() -> None:
        if event.wait(10):
            signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    return thread


def test_a_grant_that_beats_the_interruption_is_released() -> None:
    inner = _GrantedAnyway()
    twin = BlockingLockBackend(inner)
    interrupter = _interrupt_main_when(inner.granted)
    with pytest.raises(KeyboardInterrupt):
        twin.acquire("job", 30, 10)
    interrupter.join()
    # The lease the caller never received was released: the lock is free.
    twin.release(twin.acquire("job", 30, 0))
    twin.close()


def test_errors_pass_unchanged_and_a_closed_twin_refuses() -> None:
    twin = BlockingModalLockBackend(MemoryLockBackend())
    lock = SyncLock(twin, "job", ttl=30)
    lease = lock.acquire(timeout=0)
    with pytest.raises(LockNotAcquired):
        lock.acquire(timeout=0)
    with pytest.raises(ValueError, match="ttl"):
        twin.extend(lease, -1)
    with pytest.raises(TypeError):
        twin.acquire("job", "30", 0)  # type: ignore[arg-type]
    lock.release(lease)
    with pytest.raises(LockNotOwned):
        lock.release(lease)
    rw = SyncReadWriteLock(twin, "doc", ttl=30, timeout=0)
    rw.read.release(rw.read.acquire())
    twin.close()
    twin.close()  # closing twice is harmless
    with pytest.raises(BackendUnavailable, match="closed"):
        lock.acquire(timeout=0)
    with pytest.raises(BackendUnavailable, match="closed"):
        twin.release(lease)
    assert not [t for t in threading.enumerate() if t.name == "headway-memory"]


def test_a_call_from_the_twins_own_loop_is_refused() -> None:
    twin = BlockingLockBackend(MemoryLockBackend())
    twin.release(twin.acquire("warm", 30, 0))  # the loop runs

    async def inside() -> None:
        twin.acquire("job", 30, 0)  # would wait for its own loop

    with pytest.raises(RuntimeError, match="its own event loop"):
        twin._loop.run(inside())
    twin.close()


@pytest.mark.anyio
async def test_works_from_inside_a_running_event_loop(postgres_url: str) -> None:
    # The caller's loop is not the twin's: the call blocks it, and completes.
    twin = SyncPostgresLockBackend(postgres_url)
    try:
        lease = twin.acquire("in-a-loop", 30, 0)
        assert asyncio.get_running_loop() is not None
        with pytest.raises(LockNotAcquired):
            twin.acquire("in-a-loop", 30, 0)
        twin.release(lease)
    finally:
        twin.close()


def _in_child(twin: BlockingLockBackend) -> str:
    """Acquire and release in a forked child; return what happened."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's cleanup
        os.close(read)
        signal.alarm(10)  # a child that hangs dies: the parent reads no outcome
        try:
            twin.release(twin.acquire("forked", 30, 0))
            outcome = "ok"
        except RuntimeError as exc:
            outcome = f"RuntimeError: {exc}"
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        outcome = pipe.read()
    os.waitpid(pid, 0)
    return outcome


@pytest.mark.skipif(sys.platform == "win32", reason="no fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_fork_a_used_twin_is_refused_in_the_child_an_unused_one_works() -> None:
    used, unused = (
        BlockingLockBackend(MemoryLockBackend()),
        BlockingLockBackend(MemoryLockBackend()),
    )
    used.release(used.acquire("warm", 30, 0))
    try:
        assert "before this process forked" in _in_child(used)
        assert _in_child(unused) == "ok"
        used.release(used.acquire("forked", 30, 0))  # the parent's twin still works
    finally:
        used.close()
        unused.close()


def test_the_twins_refuse_bad_arguments_when_made() -> None:
    with pytest.raises(ValueError, match="async driver"):
        SyncPostgresLockBackend("postgresql+nosuchdriver://app@db/app")
    with pytest.raises(ValueError, match="PostgreSQL"):
        SyncPostgresLockBackend("sqlite+aiosqlite://")
    with pytest.raises(ValueError, match="node_timeout"):
        SyncRedlockBackend.from_urls(["redis://127.0.0.1:1"], node_timeout=0)
    with pytest.raises(ValueError):
        SyncRedlockBackend([])


def test_an_idle_twin_starts_no_thread() -> None:
    before = threading.active_count()
    twin = BlockingLockBackend(MemoryLockBackend())
    assert threading.active_count() == before
    twin.release(twin.acquire("job", 30, 0))
    assert threading.active_count() == before + 1
    twin.close()
    assert threading.active_count() == before
