"""What the MySQL lock tests read from the server: holders, waiters, pooled sessions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from headway.lock.backends.mysql import MySQLLockBackend, lock_name


def name_of(backend: MySQLLockBackend, resource: str) -> str:
    return lock_name(resource, backend.database)


async def holder(engine: AsyncEngine, name: str) -> int | None:
    """The connection id holding the user-level lock ``name``, or None."""
    async with engine.connect() as conn:
        found = (await conn.execute(sa.text("SELECT IS_USED_LOCK(:n)"), {"n": name})).scalar()
        return None if found is None else int(found)


async def waiters(engine: AsyncEngine, name: str) -> int:
    """Sessions waiting in ``GET_LOCK(name, …)``."""
    async with engine.connect() as conn:
        query = sa.text(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
            " WHERE STATE = 'User lock' AND INFO LIKE :pattern"
        )
        return int((await conn.execute(query, {"pattern": f"%{name}%"})).scalar_one())


def sessions_out(engine: AsyncEngine) -> int:
    """Connections checked out of ``engine``'s pool: the backend keeps one per lease held."""
    pool = engine.pool
    assert isinstance(pool, QueuePool), pool
    return pool.checkedout()


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 5.0) -> None:
    """Poll server-side state (there is no event to wait for) until ``check`` holds."""
    end = time.monotonic() + within
    while not await check():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.02)


def waiting(engine: AsyncEngine, name: str, n: int = 1) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await waiters(engine, name) == n

    return check


def free(engine: AsyncEngine, name: str) -> Callable[[], Awaitable[bool]]:
    """Nobody holds ``name`` and nobody waits for it."""

    async def check() -> bool:
        return await holder(engine, name) is None and await waiters(engine, name) == 0

    return check
