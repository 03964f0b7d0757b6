"""What only queued backends (``QueuedBackend``) show: the driver's attempts, wake-ups,
FIFO order. Over the entries of ``LOCK_BACKENDS`` (conftest) that offer ``queued``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from headway import Lock, LockBackend
from headway.lock import flow as _flow
from headway.lock.flow import Try
from headway.lock.lease import new_token

pytestmark = [pytest.mark.anyio, pytest.mark.needs("queued")]


async def test_a_retried_attempt_gets_the_same_grant(lock_backend: LockBackend) -> None:
    # redis-py retries a command whose reply was lost: the script runs twice.
    step = Try(new_token(), 5000, "", 2000)
    first = await lock_backend._try("r", step)  # type: ignore[attr-defined]
    again = await lock_backend._try("r", step)  # type: ignore[attr-defined]
    assert first.granted
    assert again == first
    other = await lock_backend._try("r", Try(new_token(), 5000, "", 2000))  # type: ignore[attr-defined]
    assert not other.granted


async def test_waiter_is_woken_by_release_not_by_polling(
    lock_backend: LockBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With waits capped at 60 s, only a wake-up lets the waiter in before the
    # test's 5 s timeout: a polling waiter (or a lost wake-up) fails this test.
    monkeypatch.setattr(_flow, "WAIT_CAP", 60.0)
    lock = Lock(lock_backend, "r", ttl=30)
    holder = await lock.acquire()
    tries = 0
    queued = asyncio.Event()
    original = lock_backend._attempt  # type: ignore[attr-defined]

    async def counting_try(*args: Any) -> Any:
        nonlocal tries
        tries += 1
        result = await original(*args)
        queued.set()
        return result

    lock_backend._attempt = counting_try  # type: ignore[attr-defined]
    waiter = asyncio.create_task(lock.acquire(timeout=30))
    await queued.wait()
    await lock.release(holder)
    async with asyncio.timeout(5):
        lease = await waiter
    # The failed attempt, at most one retry after subscribing, the granted attempt.
    assert tries <= 3
    await lock.release(lease)


@pytest.mark.needs("fifo")
async def test_waiters_are_served_first_come_first_served(lock_backend: LockBackend) -> None:
    lock = Lock(lock_backend, "fifo", ttl=30, timeout=30)
    holder = await lock.acquire()
    order: list[int] = []
    queued = [asyncio.Event() for _ in range(5)]

    async def waiter(i: int) -> None:
        lease = await lock.acquire()
        order.append(i)
        await lock.release(lease)

    original = lock_backend._attempt  # type: ignore[attr-defined]
    tasks = []
    for i in range(5):
        # Start the next waiter only once the previous one holds its place in line.
        async def tracked(*args: Any, i: int = i) -> Any:
            result = await original(*args)
            queued[i].set()
            return result

        lock_backend._attempt = tracked  # type: ignore[attr-defined]
        tasks.append(asyncio.create_task(waiter(i)))
        await queued[i].wait()
    lock_backend._attempt = original  # type: ignore[attr-defined]
    await lock.release(holder)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
