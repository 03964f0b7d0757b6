"""PostgresLockBackend: a cancelled acquire never leaves a session holding the lock."""

from __future__ import annotations

import asyncio
import random

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from headway.lock.backends.postgres import PostgresLockBackend, advisory_key
from tests.lock.backends.postgres.sessions import (
    Elsewhere,
    eventually,
    lock_rows,
    sessions_out,
    waiting,
)

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


async def test_cancelled_waiter_leaves_nothing(
    backend: PostgresLockBackend, engine: AsyncEngine, resource: str
) -> None:
    holder = await backend.acquire(resource, ttl=10, timeout=0)
    waiter = asyncio.ensure_future(backend.acquire(resource, ttl=10, timeout=30))
    await eventually(waiting(engine, resource))
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await eventually(waiting(engine, resource, 0))
    await backend.release(holder)
    lease = await backend.acquire(resource, ttl=10, timeout=0)
    await backend.release(lease)
    assert sessions_out(engine) == 0


async def test_cancelled_at_any_moment_strands_nothing(
    backend: PostgresLockBackend, engine: AsyncEngine, resource: str
) -> None:
    rng = random.Random()
    outcomes = set()
    for i in range(15):
        task = asyncio.ensure_future(backend.acquire(resource, ttl=30, timeout=5))
        # Every third one is cancelled one loop turn in, surely mid-acquire (it needs
        # I/O); the others at a random moment, often after the grant.
        await asyncio.sleep(0 if i % 3 == 0 else rng.uniform(0, 0.01))
        task.cancel()
        try:
            lease = await task
        except asyncio.CancelledError:
            outcomes.add("cancelled")
        else:
            outcomes.add("granted")
            await backend.release(lease)

        async def free() -> bool:
            return await lock_rows(engine, resource) == []

        # A session ended by a cancellation lets go within moments, not after its 30 s TTL.
        await eventually(free)
        assert sessions_out(engine) == 0
    assert "cancelled" in outcomes


async def test_cancelled_just_after_the_grant_strands_nothing(
    backend: PostgresLockBackend, engine: AsyncEngine, postgres_url: str, resource: str
) -> None:
    key = advisory_key(resource)
    elsewhere = Elsewhere()
    other = create_async_engine(postgres_url, poolclass=NullPool)
    holder = elsewhere.run(other.connect().start())
    lock = sa.text("SELECT pg_advisory_lock(:key)")
    unlock = sa.text("SELECT pg_advisory_unlock(:key)")
    granted = sa.text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND classid::bigint = :hi AND objid::bigint = :lo"
    )

    async def hand_over() -> None:
        # Session-level and transaction-level advisory locks on one key conflict.
        await holder.execute(unlock, {"key": key})
        ids = {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF}
        while not (await holder.execute(granted, ids)).scalar():
            await asyncio.sleep(0.005)

    try:
        elsewhere.run(holder.execute(lock, {"key": key}))
        waiter = asyncio.ensure_future(backend.acquire(resource, ttl=30, timeout=10))
        await eventually(waiting(engine, resource))
        # Our loop is blocked while the server grants the waiter the lock, so the
        # cancellation lands after the grant and before we can see the reply.
        elsewhere.run(hand_over())
        assert waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

        async def free() -> bool:
            return await lock_rows(engine, resource) == []

        await eventually(free)  # at once, not after the 30 s TTL
        assert sessions_out(engine) == 0
    finally:
        elsewhere.run(holder.close())
        elsewhere.run(other.dispose())
        elsewhere.close()
