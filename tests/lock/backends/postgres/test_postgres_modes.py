"""PostgresLockBackend's read-write locks and semaphores, against the server's lock table."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from headway import Lease, LockNotAcquired
from headway.lock.backends.postgres import PostgresLockBackend
from headway.lock.backends.postgres_modes import family_key, slot_class
from headway.lock.modes import READ, WRITE, permits
from tests.lock.backends.postgres.sessions import eventually, sessions_out

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

_DB = "database = (SELECT oid FROM pg_database WHERE datname = current_database())"


async def key_rows(engine: AsyncEngine, key: int) -> list[bool]:
    """``granted`` of every request for the 64-bit advisory ``key``."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                f"SELECT granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
                f" AND {_DB} AND classid::bigint = :hi AND objid::bigint = :lo"
            ),
            {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF},
        )
        return sorted(bool(granted) for (granted,) in rows)


async def slots_held(engine: AsyncEngine, resource: str) -> int:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
                f" AND {_DB} AND classid::bigint = :cls"
            ),
            {"cls": slot_class(resource)},
        )
        return int(rows.scalar_one())


def rows_are(engine: AsyncEngine, key: int, expected: list[bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await key_rows(engine, key) == sorted(expected)

    return check


async def test_a_waiting_writer_queues_later_readers_which_enter_together(
    backend: PostgresLockBackend, engine: AsyncEngine, resource: str
) -> None:
    """lock.c: a request that conflicts with a waiting one waits behind it; a release
    wakes every waiter at the head that no longer conflicts."""
    read, write = backend.for_mode(READ), backend.for_mode(WRITE)
    key = family_key("rw", resource)
    first = await read.acquire(resource, ttl=30, timeout=0)
    writer = asyncio.ensure_future(write.acquire(resource, ttl=30, timeout=30))
    await eventually(rows_are(engine, key, [True, False]))
    readers = [asyncio.ensure_future(read.acquire(resource, ttl=30, timeout=30)) for _ in range(2)]
    # Both would share with the holder, yet both wait: the writer asked first.
    await eventually(rows_are(engine, key, [True, False, False, False]))
    await read.release(first)
    writer_lease = await writer
    assert await key_rows(engine, key) == [False, False, True]
    await write.release(writer_lease)
    leases = await asyncio.gather(*readers)
    assert await key_rows(engine, key) == [True, True]  # granted together
    assert all(lease.fence > writer_lease.fence > first.fence for lease in leases)
    for lease in leases:
        await read.release(lease)


async def test_fences_rise_in_queue_order(
    backend: PostgresLockBackend, engine: AsyncEngine, resource: str
) -> None:
    """Fences are taken after the grant: a writer's exceeds every earlier holder's and a
    reader's every earlier writer's, whatever order the requests were sent in."""
    read, write = backend.for_mode(READ), backend.for_mode(WRITE)
    key = family_key("rw", resource)
    holder = await read.acquire(resource, ttl=30, timeout=0)
    line: list[tuple[str, asyncio.Future[Lease]]] = []
    for kind in ["write", "read", "read", "write", "read"]:
        lock = write if kind == "write" else read
        line.append((kind, asyncio.ensure_future(lock.acquire(resource, ttl=30, timeout=30))))
        await eventually(rows_are(engine, key, [True] + [False] * len(line)))
    (_, w1), (_, r1), (_, r2), (_, w2), (_, r3) = line
    await read.release(holder)
    await write.release(await w1)
    await read.release(await r1)
    await read.release(await r2)
    await write.release(await w2)
    await read.release(await r3)
    fence = [f.result().fence for _, f in line]
    assert holder.fence < fence[0] < min(fence[1:3])
    assert max(fence[1:3]) < fence[3] < fence[4]


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("kind", ["read", "write", "permit at the head", "permit behind it"])
async def test_a_cancelled_waiter_leaves_no_lock_behind(
    backend: PostgresLockBackend, engine: AsyncEngine, resource: str, kind: str
) -> None:
    if kind in ("read", "write"):
        key, holder_view = family_key("rw", resource), backend.for_mode(WRITE)
        view = backend.for_mode(READ if kind == "read" else WRITE)
        line = 1
    else:
        key, holder_view = family_key("gate", resource), backend.for_mode(permits(1))
        view = holder_view
        line = 1 if kind == "permit at the head" else 2
    holder = await holder_view.acquire(resource, ttl=30, timeout=0)
    waiters = [
        asyncio.ensure_future(view.acquire(resource, ttl=30, timeout=30)) for _ in range(line)
    ]
    if kind.startswith("permit"):
        # The head holds the gate; whoever is behind it waits for the gate.
        await eventually(rows_are(engine, key, [True] + [False] * (line - 1)))
    else:
        await eventually(rows_are(engine, key, [True, False]))
    for waiter in reversed(waiters):
        await _cancel(waiter)
    expected_rows = [] if kind.startswith("permit") else [True]
    await eventually(rows_are(engine, key, expected_rows))
    assert sessions_out(engine) == 1  # the holder's: a cancelled waiter's session ended
    if kind.startswith("permit"):
        assert await slots_held(engine, resource) == 1
    await holder_view.release(holder)
    await holder_view.release(await view.acquire(resource, ttl=30, timeout=0))
    assert await key_rows(engine, key) == []
    assert sessions_out(engine) == 0


async def test_a_crashed_holders_permit_comes_back_when_its_lease_ends(
    backend: PostgresLockBackend, engine: AsyncEngine, resource: str
) -> None:
    """Of several holders, the one whose session idles out frees its slot, and the head
    of the line (woken by no release) takes it when the lease ends."""
    semaphore = backend.for_mode(permits(3))
    kept = [await semaphore.acquire(resource, ttl=30, timeout=0) for _ in range(2)]
    crashed = await semaphore.acquire(resource, ttl=0.3, timeout=0)  # never released
    loop = asyncio.get_running_loop()
    asked = loop.time()
    async with asyncio.timeout(5):
        lease = await semaphore.acquire(resource, ttl=30, timeout=20)
    assert 0.25 < loop.time() - asked < 2.0
    assert lease.fence > crashed.fence
    assert await slots_held(engine, resource) == 3
    for held in [*kept, lease]:
        await semaphore.release(held)


async def test_a_head_that_times_out_leaves_no_gate_behind(
    backend: PostgresLockBackend, engine: AsyncEngine, resource: str
) -> None:
    semaphore = backend.for_mode(permits(1))
    holder = await semaphore.acquire(resource, ttl=30, timeout=0)
    with pytest.raises(LockNotAcquired):
        await semaphore.acquire(resource, ttl=30, timeout=0.2)  # it waited at the head
    assert await key_rows(engine, family_key("gate", resource)) == []
    assert sessions_out(engine) == 1
    await semaphore.release(holder)
    await semaphore.release(await semaphore.acquire(resource, ttl=30, timeout=0))
