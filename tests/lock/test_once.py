"""``run_once``: one run per window over every backend of the shared table.

The windows are short: what depends on a lease running out on the server needs
``short_ttl`` (etcd holds leases for whole seconds, MySQL too); what only needs the
lease to be kept, or released, runs everywhere. ``test_once_fleet.py`` is the
multi-process proof.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import uuid

import pytest

from headway import (
    FakeClock,
    Lock,
    LockLost,
    LockNotAcquired,
    MemoryLockBackend,
    Skipped,
    SyncLock,
    run_once,
)
from headway.lock.capabilities import WindowClaimBackend
from headway.lock.contract import LockBackend, SyncLockBackend

pytestmark = pytest.mark.anyio


def _name() -> str:
    return f"job-{uuid.uuid4().hex[:12]}"


async def test_one_of_concurrent_calls_runs_the_others_skip(lock_backend: LockBackend) -> None:
    name, entered, finish = _name(), asyncio.Event(), asyncio.Event()
    runs: list[int] = []

    @run_once(lock_backend, name, at_most_for=10)
    async def job(instance: int) -> str:
        runs.append(instance)
        entered.set()
        await finish.wait()
        return f"ran on {instance}"

    first = asyncio.create_task(job(0))
    await entered.wait()
    assert await asyncio.gather(*(job(i) for i in range(1, 4))) == [Skipped(name)] * 3
    finish.set()
    assert await first == "ran on 0"
    assert runs == [0]


async def test_at_least_for_keeps_the_window_after_a_quick_body(lock_backend: LockBackend) -> None:
    name = _name()
    job = run_once(lock_backend, name, at_most_for=10, at_least_for=5)(_quick)
    assert await job() == "done"
    # The body is over, but the window is not: a later caller (a clock behind) skips,
    # and so does another instance's wrapper of the job.
    assert isinstance(await job(), Skipped)
    other = run_once(lock_backend, name, at_most_for=10, at_least_for=5)(_quick)
    assert await other() == Skipped(name)
    if not isinstance(lock_backend, WindowClaimBackend):  # the window is the lock's lease
        with pytest.raises(LockNotAcquired):
            await lock_backend.acquire(name, 1, 0)


async def test_no_at_least_for_releases_when_the_body_ends(lock_backend: LockBackend) -> None:
    job = run_once(lock_backend, _name(), at_most_for=10)(_quick)
    assert [await job() for _ in range(3)] == ["done"] * 3


async def test_an_at_least_for_already_spent_releases_at_once(lock_backend: LockBackend) -> None:
    @run_once(lock_backend, _name(), at_most_for=10, at_least_for=0.05)
    async def job() -> str:
        await asyncio.sleep(0.1)
        return "done"

    assert await job() == "done"
    assert await job() == "done"


async def test_a_failing_body_raises_and_keeps_at_least_for(lock_backend: LockBackend) -> None:
    name = _name()

    @run_once(lock_backend, name, at_most_for=10, at_least_for=5)
    async def job() -> None:
        raise RuntimeError("report failed")

    with pytest.raises(RuntimeError, match="report failed"):
        await job()
    assert await job() == Skipped(name)  # one attempt per window, as ShedLock


async def test_a_body_past_at_most_for_is_cancelled(lock_backend: LockBackend) -> None:
    cancelled = asyncio.Event()

    @run_once(lock_backend, _name(), at_most_for=0.2)
    async def job() -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    started = time.monotonic()
    with pytest.raises(LockLost, match="ran past at_most_for"):
        await job()
    assert cancelled.is_set()
    assert time.monotonic() - started < 1.5


async def test_the_body_s_own_timeout_is_not_an_overrun(lock_backend: LockBackend) -> None:
    @run_once(lock_backend, _name(), at_most_for=10)
    async def job() -> None:
        raise TimeoutError("upstream")

    with pytest.raises(TimeoutError, match="upstream"):
        await job()


@pytest.mark.needs("short_ttl")
async def test_each_window_runs_once_across_offset_clocks(lock_backend: LockBackend) -> None:
    # Three instances call every 0.6 s, their clocks 0.075 s apart (up to half of
    # at_least_for): the first caller of each window runs, the later ones skip.
    name, offsets, period = _name(), [0.0, 0.075, 0.15], 0.6
    runs: list[tuple[int, int]] = []

    @run_once(lock_backend, name, at_most_for=2, at_least_for=0.3)
    async def job(window: int, instance: int) -> None:
        runs.append((window, instance))

    async def call(window: int, instance: int, base: float) -> None:
        await asyncio.sleep(base + window * period + offsets[instance] - time.monotonic())
        await job(window, instance)

    await lock_backend.release(await lock_backend.acquire(_name(), 1, 1))  # connected
    base = time.monotonic()
    await asyncio.gather(*(call(w, i, base) for w in range(3) for i in range(3)))
    # One run per window; which instance wins is up to the machine (0 unless it stalls).
    assert [window for window, _ in runs] == [0, 1, 2]


@pytest.mark.needs("short_ttl")
async def test_a_dead_runner_s_lock_frees_after_at_most_for(lock_backend: LockBackend) -> None:
    name = _name()
    # A runner that died mid-run: its lease or claim (at_most_for) is never released.
    if isinstance(lock_backend, WindowClaimBackend):
        assert await lock_backend.claim_window(name, 0.4) is not None
    else:
        await Lock(lock_backend, name, ttl=0.4).acquire()
    job = run_once(lock_backend, name, at_most_for=0.4)(_quick)
    assert await job() == Skipped(name)
    await asyncio.sleep(0.5)
    assert await job() == "done"


async def test_at_least_for_is_counted_on_the_lease_s_clock() -> None:
    clock = FakeClock(100.0)
    backend = MemoryLockBackend(clock=clock)
    job = run_once(backend, "report", at_most_for=60, at_least_for=30, clock=clock)(_quick)
    assert await job() == "done"
    clock.advance(29.9)
    assert await job() == Skipped("report")
    clock.advance(0.2)
    assert await job() == "done"


async def test_a_body_s_time_counts_towards_at_least_for() -> None:
    clock = FakeClock()
    backend = MemoryLockBackend(clock=clock)

    @run_once(backend, "report", at_most_for=60, at_least_for=30, clock=clock)
    async def job() -> str:
        clock.advance(20)  # the run took 20 s
        return "done"

    assert await job() == "done"
    clock.advance(9.9)
    assert await job() == Skipped("report")
    clock.advance(0.2)
    assert await job() == "done"


async def test_the_wrapper_keeps_the_function_s_face() -> None:
    @run_once(MemoryLockBackend(), "report", at_most_for=10)
    async def job(day: str, *, dry_run: bool = False) -> str:
        """Build the day's report."""
        return f"{day} {dry_run}"

    assert job.__name__ == "job"
    assert job.__doc__ == "Build the day's report."
    assert str(inspect.signature(job)) == "(day: 'str', *, dry_run: 'bool' = False) -> 'str'"
    assert await job("2026-11-27", dry_run=True) == "2026-11-27 True"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"at_most_for": 10, "at_least_for": 11}, ValueError, "at_least_for must be"),
        ({"at_most_for": 10, "at_least_for": -1}, ValueError, "at_least_for must be"),
        ({"at_most_for": 0}, ValueError, "ttl must be > 0"),
        ({"at_most_for": float("inf")}, ValueError, "finite"),
        ({"at_most_for": "10"}, TypeError, "number of seconds"),
        ({"at_most_for": 10, "at_least_for": None}, TypeError, "number of seconds"),
    ],
)
def test_bad_durations_are_refused(kwargs: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        run_once(MemoryLockBackend(), "report", **kwargs)  # type: ignore[arg-type]


def test_bad_names_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        run_once(MemoryLockBackend(), "", at_most_for=10)
    with pytest.raises(TypeError, match="must be a str"):
        run_once(MemoryLockBackend(), b"report", at_most_for=10)  # type: ignore[arg-type]


def test_a_function_and_a_backend_of_different_kinds_are_refused() -> None:
    decorator = run_once(MemoryLockBackend(), "report", at_most_for=10)
    with pytest.raises(TypeError, match="needs a SyncLockBackend"):
        decorator(lambda: None)


async def _quick() -> str:
    return "done"


# --- sync functions over a SyncLockBackend -------------------------------------------


def _sync_quick() -> str:
    return "done"


def test_sync_one_of_concurrent_calls_runs(sync_lock_backend: SyncLockBackend) -> None:
    name, entered, finish = _name(), threading.Event(), threading.Event()
    runs: list[int] = []

    @run_once(sync_lock_backend, name, at_most_for=10)
    def job(instance: int) -> str:
        runs.append(instance)
        entered.set()
        assert finish.wait(5)
        return f"ran on {instance}"

    results: list[object] = []
    first = threading.Thread(target=lambda: results.append(job(0)))
    first.start()
    assert entered.wait(5)
    assert [job(i) for i in range(1, 4)] == [Skipped(name)] * 3
    finish.set()
    first.join()
    assert results == ["ran on 0"]
    assert runs == [0]


def test_sync_at_least_for_keeps_then_frees(sync_lock_backend: SyncLockBackend) -> None:
    name = _name()
    # A window of 1 s: the second call comes well within it even on a loaded machine (with
    # 0.3 s, two workers' load once let the window pass between the two calls).
    job = run_once(sync_lock_backend, name, at_most_for=5, at_least_for=1.0)(_sync_quick)
    assert job() == "done"
    assert job() == Skipped(name)
    time.sleep(1.1)
    assert job() == "done"


def test_sync_without_at_least_for_releases(sync_lock_backend: SyncLockBackend) -> None:
    job = run_once(sync_lock_backend, _name(), at_most_for=5)(_sync_quick)
    assert [job() for _ in range(3)] == ["done"] * 3


def test_sync_failure_raises_and_keeps(sync_lock_backend: SyncLockBackend) -> None:
    name = _name()

    @run_once(sync_lock_backend, name, at_most_for=5, at_least_for=3)
    def job() -> None:
        raise RuntimeError("report failed")

    with pytest.raises(RuntimeError, match="report failed"):
        job()
    assert job() == Skipped(name)


def test_sync_overrun_is_reported_when_the_body_returns(
    sync_lock_backend: SyncLockBackend,
) -> None:
    name = _name()

    @run_once(sync_lock_backend, name, at_most_for=0.2)
    def job() -> None:
        time.sleep(0.3)

    with pytest.raises(LockLost, match="ran past at_most_for"):
        job()
    SyncLock(sync_lock_backend, name).release(SyncLock(sync_lock_backend, name).acquire())


def test_an_async_function_over_a_sync_backend_is_refused(
    sync_lock_backend: SyncLockBackend,
) -> None:
    with pytest.raises(TypeError, match="needs an async LockBackend"):
        run_once(sync_lock_backend, "report", at_most_for=10)(_quick)
