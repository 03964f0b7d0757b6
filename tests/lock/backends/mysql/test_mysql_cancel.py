"""MySQLLockBackend: a cancelled acquire never leaves a session holding or awaiting the lock.

A client closing its socket does not end a ``GET_LOCK`` wait on the server (it waits
out its timeout, and may be granted meanwhile), so these tests look at the server:
``IS_USED_LOCK`` for the holder and the process list for waiters.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from headway.lock.backends.mysql import MySQLLockBackend
from tests.lock.backends.mysql.sessions import (
    eventually,
    free,
    holder,
    name_of,
    sessions_out,
    waiting,
)
from tests.lock.backends.postgres.sessions import Elsewhere

pytestmark = [pytest.mark.anyio, pytest.mark.mysql]


async def test_cancelled_waiter_leaves_nothing(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    name = name_of(backend, resource)
    first = await backend.acquire(resource, ttl=10, timeout=0)
    waiter = asyncio.ensure_future(backend.acquire(resource, ttl=10, timeout=30))
    await eventually(waiting(engine, name))
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # At once: the server's wait was interrupted, not left to its 30 s timeout.
    await eventually(waiting(engine, name, 0), within=2)
    assert sessions_out(engine) == 1
    await backend.release(first)
    lease = await backend.acquire(resource, ttl=10, timeout=0)
    await backend.release(lease)
    assert sessions_out(engine) == 0


async def test_cancelled_at_any_moment_strands_nothing(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    name = name_of(backend, resource)
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
        # A session ended by a cancellation lets go within moments, not after its 30 s TTL.
        await eventually(free(engine, name))
        assert sessions_out(engine) == 0
    assert "cancelled" in outcomes


async def test_cancelled_just_after_the_grant_strands_nothing(
    backend: MySQLLockBackend, engine: AsyncEngine, mysql_url: str, resource: str
) -> None:
    name = name_of(backend, resource)
    elsewhere = Elsewhere()
    other = create_async_engine(mysql_url, poolclass=NullPool)
    theirs = elsewhere.run(other.connect().start())

    async def hand_over() -> None:
        await theirs.execute(sa.text("SELECT RELEASE_LOCK(:n)"), {"n": name})
        # Wait (our loop blocked meanwhile) until the server granted our waiter.
        while (
            await theirs.execute(sa.text("SELECT IS_USED_LOCK(:n)"), {"n": name})
        ).scalar() is None:
            await asyncio.sleep(0.005)

    try:
        elsewhere.run(theirs.execute(sa.text("SELECT GET_LOCK(:n, 0)"), {"n": name}))
        waiter = asyncio.ensure_future(backend.acquire(resource, ttl=30, timeout=10))
        await eventually(waiting(engine, name))
        # Our loop is blocked while the server grants the waiter the lock, so the
        # cancellation lands after the grant and before we can see the reply.
        elsewhere.run(hand_over())
        assert waiter.cancel()
        start = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await eventually(free(engine, name))  # at once, not after the 30 s TTL
        assert time.monotonic() - start < 5
        assert sessions_out(engine) == 0
        assert await holder(engine, name) is None
    finally:
        elsewhere.run(theirs.close())
        elsewhere.run(other.dispose())
        elsewhere.close()
