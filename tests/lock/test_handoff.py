"""Handoff between queued waiters: exact FIFO order, driven by wake-ups alone.

Waits are made effectively unbounded (``WAIT_CAP`` and ``PLACE_MS`` patched up),
so a lost wake-up hangs the test into its guard timeout instead of passing
slowly; every step each waiter takes is logged and compared exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from redis import asyncio as aioredis

import headway
from headway.lock import _flow
from headway.lock._backend import AsyncWaiter, QueuedBackend
from headway.lock._flow import Attempt, Try

pytestmark = pytest.mark.anyio

GUARD = 10.0  # seconds; only reached when a wake-up is lost


class Log:
    """What each waiter did, in order: ``refused``, ``granted`` or ``wait``."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, str]] = []
        self._changed = asyncio.Event()

    def add(self, waiter: str, step: str) -> None:
        self.steps.append((waiter, step))
        self._changed.set()

    def of(self, waiter: str) -> list[str]:
        return [step for who, step in self.steps if who == waiter]

    def waiters(self) -> list[str]:
        return list(dict.fromkeys(who for who, step in self.steps if step == "refused"))

    async def until(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(GUARD):
            while not condition():
                self._changed.clear()
                await self._changed.wait()


class _LoggedWaiter:
    def __init__(self, wake: AsyncWaiter, log: Log, waiter: str) -> None:
        self.wake, self.log, self.waiter = wake, log, waiter

    async def wait(self, seconds: float) -> None:
        self.log.add(self.waiter, "wait")
        await self.wake.wait(seconds)


@contextlib.asynccontextmanager
async def _logged(
    listen: AbstractAsyncContextManager[AsyncWaiter], log: Log, waiter: str
) -> AsyncIterator[AsyncWaiter]:
    async with listen as wake:
        yield _LoggedWaiter(wake, log, waiter)


def _note(log: Log, step: Try, attempt: Attempt) -> Attempt:
    log.add(step.waiter, "granted" if attempt.granted else "refused")
    return attempt


class LoggedRedis(headway.RedisLockBackend):
    def __init__(self, client: Any, log: Log) -> None:
        super().__init__(client)
        self.log = log

    async def _try(self, resource: str, step: Try) -> Attempt:
        return _note(self.log, step, await super()._try(resource, step))

    def _listen(self, resource: str, waiter: str) -> AbstractAsyncContextManager[Any]:
        return _logged(super()._listen(resource, waiter), self.log, waiter)


class LoggedMemory(headway.MemoryLockBackend):
    def __init__(self, log: Log) -> None:
        super().__init__()
        self.log = log

    async def _try(self, resource: str, step: Try) -> Attempt:
        return _note(self.log, step, await super()._try(resource, step))

    def _listen(  # type: ignore[override]  # the base is typed as its generator's CM
        self, resource: str, waiter: str
    ) -> AbstractAsyncContextManager[Any]:
        return _logged(super()._listen(resource, waiter), self.log, waiter)


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
    # Every waiter was granted on its first attempt after its last wait: woken, never polling.
    for waiter in log.waiters():
        steps = log.of(waiter)
        assert steps[-2:] == ["wait", "granted"], steps
        assert steps.count("granted") == 1


async def test_a_waiter_joining_listeners_waits_after_a_single_attempt(
    redis_client: aioredis.Redis,
) -> None:
    log = Log()
    backend = LoggedRedis(redis_client, log)
    try:
        lock = headway.Lock(backend, "join", ttl=60, timeout=60)
        held = await lock.acquire()
        first = asyncio.create_task(lock.acquire())
        await log.until(lambda: len(log.waiters()) == 1 and "wait" in log.of(log.waiters()[0]))
        second = asyncio.create_task(lock.acquire())
        await log.until(lambda: len(log.waiters()) == 2 and "wait" in log.of(log.waiters()[1]))
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
        assert log.of(a)[-1] == log.of(b)[-1] == "granted"
    finally:
        await backend.aclose()
