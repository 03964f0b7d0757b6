"""Handoff between queued waiters: exact FIFO order, driven by wake-ups alone.

Async tasks and sync threads, one shared backend (one subscription) or one
backend per waiter (as separate processes would be).

Waits are made effectively unbounded (``WAIT_CAP`` and ``PLACE_MS`` patched up),
so a lost wake-up hangs the test into its guard timeout instead of passing
slowly; every step each waiter takes is logged and compared exactly.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from redis import asyncio as aioredis

import headway
from headway.lock import flow as _flow
from headway.lock.contract import AsyncWaiter, SyncWaiter
from headway.lock.driver import QueuedBackend
from headway.lock.flow import Attempt, Try

GUARD = 10.0  # seconds; only reached when a wake-up is lost


class Log:
    """What each waiter did, in order: ``refused``, ``granted`` or ``wait``."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, str]] = []
        self._cond = threading.Condition()
        self._changed: asyncio.Event | None = None  # async tests log from the loop only

    def add(self, waiter: str, step: str) -> None:
        with self._cond:
            self.steps.append((waiter, step))
            self._cond.notify_all()
        if self._changed is not None:
            self._changed.set()

    def of(self, waiter: str) -> list[str]:
        with self._cond:
            return [step for who, step in self.steps if who == waiter]

    def waiters(self) -> list[str]:
        with self._cond:
            return list(dict.fromkeys(who for who, step in self.steps if step == "refused"))

    async def until(self, condition: Callable[[], bool]) -> None:
        self._changed = asyncio.Event()
        async with asyncio.timeout(GUARD):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    def until_sync(self, condition: Callable[[], bool]) -> None:
        with self._cond:
            assert self._cond.wait_for(condition, GUARD)

    def waited(self, n: int) -> bool:
        """The first ``n`` waiters have all started waiting."""
        return len(self.waiters()) == n and all("wait" in self.of(w) for w in self.waiters())


class _LoggedWaiter:
    def __init__(self, wake: AsyncWaiter, log: Log, waiter: str) -> None:
        self.wake, self.log, self.waiter = wake, log, waiter

    async def wait(self, seconds: float) -> int | None:
        self.log.add(self.waiter, "wait")
        handed = await self.wake.wait(seconds)
        if handed is not None:
            self.log.add(self.waiter, "handed")
        return handed


class _LoggedSyncWaiter:
    def __init__(self, wake: SyncWaiter, log: Log, waiter: str) -> None:
        self.wake, self.log, self.waiter = wake, log, waiter

    def wait(self, seconds: float) -> int | None:
        self.log.add(self.waiter, "wait")
        handed = self.wake.wait(seconds)
        if handed is not None:
            self.log.add(self.waiter, "handed")
        return handed


def _note(log: Log, step: Try, attempt: Attempt) -> Attempt:
    log.add(step.waiter, "granted" if attempt.granted else "refused")
    return attempt


class _Logged(QueuedBackend):
    """Logs every attempt (ridden or sent) and every wait of the backend it is mixed into."""

    log: Log

    async def _attempt(self, resource: str, step: Try) -> Attempt:
        return _note(self.log, step, await super()._attempt(resource, step))

    async def _listen(self, resource: str, waiter: str) -> AsyncWaiter:
        wake = await super()._listen(resource, waiter)  # type: ignore[safe-super]
        return _LoggedWaiter(wake, self.log, waiter)

    def _join(self, resource: str, waiter: str) -> AsyncWaiter | None:
        wake = super()._join(resource, waiter)
        return None if wake is None else _LoggedWaiter(wake, self.log, waiter)


class LoggedRedis(_Logged, headway.RedisLockBackend):
    def __init__(self, client: Any, log: Log) -> None:
        super().__init__(client)
        self.log = log


class LoggedMemory(_Logged, headway.MemoryLockBackend):
    def __init__(self, log: Log) -> None:
        super().__init__()
        self.log = log


class LoggedSyncRedis(headway.SyncRedisLockBackend):
    def __init__(self, client: Any, log: Log) -> None:
        super().__init__(client)
        self.log = log

    def _attempt(self, resource: str, step: Try) -> Attempt:
        return _note(self.log, step, super()._attempt(resource, step))

    def _listen(self, resource: str, waiter: str) -> SyncWaiter:
        return _LoggedSyncWaiter(super()._listen(resource, waiter), self.log, waiter)

    def _join(self, resource: str, waiter: str) -> SyncWaiter | None:
        wake = super()._join(resource, waiter)
        return None if wake is None else _LoggedSyncWaiter(wake, self.log, waiter)


@pytest.fixture(autouse=True)
def _waits_end_only_on_wake_ups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_flow, "WAIT_CAP", 60.0)
    monkeypatch.setattr(_flow, "PLACE_MS", 60_000)


@pytest.fixture(params=["redis, one backend", "redis, a backend per waiter", "memory"])
async def backends(
    request: pytest.FixtureRequest, redis_client: aioredis.Redis
) -> AsyncIterator[tuple[Log, Callable[[], QueuedBackend]]]:
    """A log and a factory: the same backend each call, or a new one (a process each)."""
    log = Log()
    made: list[QueuedBackend] = []

    def make() -> QueuedBackend:
        if made and request.param != "redis, a backend per waiter":
            return made[0]
        made.append(
            LoggedMemory(log) if request.param == "memory" else LoggedRedis(redis_client, log)
        )
        return made[-1]

    yield log, make
    for backend in made:
        if isinstance(backend, headway.RedisLockBackend):
            await backend.aclose()


def _check_woken_not_polling(log: Log, handoff: bool) -> None:
    """Each waiter was granted once, by its first wake-up if it waited.

    On Redis the releaser hands the lock over with the wake-up ("handed"); on
    the memory backend the woken waiter's next attempt takes it ("granted").
    (A waiter may also be granted by the attempt that follows its subscription,
    when the waiters ahead of it were done by then.)
    """
    last = "handed" if handoff else "granted"
    for waiter in log.waiters():
        steps = log.of(waiter)
        assert steps.count("granted") + steps.count("handed") == 1, steps
        assert steps[-1] in ("granted", "handed"), steps
        assert "wait" not in steps or steps[steps.index("wait") :] == ["wait", last], steps


@pytest.mark.anyio
async def test_queued_waiters_are_granted_in_arrival_order(
    backends: tuple[Log, Callable[[], QueuedBackend]],
) -> None:
    log, make = backends
    holder = headway.Lock(make(), "fifo", ttl=60, timeout=60)
    held = await holder.acquire()
    order: list[int] = []

    async def wait_then_hold(i: int) -> None:
        lock = headway.Lock(make(), "fifo", ttl=60, timeout=60)
        lease = await lock.acquire()
        order.append(i)
        await lock.release(lease)

    tasks = []
    for i in range(6):
        tasks.append(asyncio.create_task(wait_then_hold(i)))
        # The next one starts only once this one is queued (refused at least once).
        await log.until(lambda n=i + 1: len(log.waiters()) == n)  # type: ignore[misc]
    assert order == []
    await holder.release(held)
    async with asyncio.timeout(GUARD):
        await asyncio.gather(*tasks)
    assert order == list(range(6))
    _check_woken_not_polling(log, handoff=not isinstance(holder.backend, LoggedMemory))


@pytest.mark.anyio
async def test_a_waiter_joining_listeners_waits_after_a_single_attempt(
    redis_client: aioredis.Redis,
) -> None:
    log = Log()
    backend = LoggedRedis(redis_client, log)
    try:
        lock = headway.Lock(backend, "join", ttl=60, timeout=60)
        held = await lock.acquire()
        first = asyncio.create_task(lock.acquire())
        await log.until(lambda: log.waited(1))
        second = asyncio.create_task(lock.acquire())
        await log.until(lambda: log.waited(2))
        a, b = log.waiters()
        # The first subscribes, then tries again: a release between its attempt and
        # the subscription must not be missed. The second finds the channel
        # subscribed, listens before its attempt, and so needs no second one.
        assert log.of(a) == ["refused", "refused", "wait"]
        assert log.of(b) == ["refused", "wait"]
        await lock.release(held)
        async with asyncio.timeout(GUARD):
            await lock.release(await first)
            await lock.release(await second)
        assert log.of(a)[-1] == log.of(b)[-1] == "handed"
    finally:
        await backend.aclose()


@pytest.fixture
def sync_backends(
    sync_redis_client: Any,
) -> Iterator[tuple[Log, Callable[[bool], headway.SyncRedisLockBackend]]]:
    log = Log()
    made: list[headway.SyncRedisLockBackend] = []

    def make(shared: bool) -> headway.SyncRedisLockBackend:
        if not (made and shared):
            made.append(LoggedSyncRedis(sync_redis_client, log))
        return made[-1]

    yield log, make
    for backend in made:
        backend.close()


@pytest.mark.parametrize("shared", [True, False], ids=["one backend", "a backend per waiter"])
def test_sync_waiters_are_granted_in_arrival_order(
    sync_backends: tuple[Log, Callable[[bool], headway.SyncRedisLockBackend]], shared: bool
) -> None:
    log, make = sync_backends
    holder = headway.SyncLock(make(shared), "fifo", ttl=60, timeout=60)
    held = holder.acquire()
    order: list[int] = []

    def wait_then_hold(i: int) -> None:
        lock = headway.SyncLock(make(shared), "fifo", ttl=60, timeout=60)
        lease = lock.acquire()
        order.append(i)
        lock.release(lease)

    threads = []
    try:
        for i in range(6):
            threads.append(threading.Thread(target=wait_then_hold, args=(i,), daemon=True))
            threads[-1].start()
            log.until_sync(lambda n=i + 1: len(log.waiters()) == n)  # type: ignore[misc]
        assert order == []
    finally:
        holder.release(held)
    for thread in threads:
        thread.join(GUARD)
    assert not any(thread.is_alive() for thread in threads)
    assert order == list(range(6))
    _check_woken_not_polling(log, handoff=True)


def test_a_sync_waiter_joining_listeners_waits_after_a_single_attempt(
    sync_backends: tuple[Log, Callable[[bool], headway.SyncRedisLockBackend]],
) -> None:
    log, make = sync_backends
    lock = headway.SyncLock(make(True), "join", ttl=60, timeout=60)
    held = lock.acquire()
    leases: list[headway.Lease] = []
    threads = [
        threading.Thread(target=lambda: leases.append(lock.acquire()), daemon=True)
        for _ in range(2)
    ]
    try:
        threads[0].start()
        log.until_sync(lambda: log.waited(1))
        threads[1].start()
        log.until_sync(lambda: log.waited(2))
    finally:
        lock.release(held)
    a, b = log.waiters()
    # (The release above may have handed ``a`` the lock already.)
    assert log.of(a)[:3] == ["refused", "refused", "wait"]
    assert log.of(b)[:2] == ["refused", "wait"]
    log.until_sync(lambda: len(leases) == 1)
    lock.release(leases[0])
    threads[0].join(GUARD)
    threads[1].join(GUARD)
    lock.release(leases[1])
    assert log.of(a)[-1] == log.of(b)[-1] == "handed"
