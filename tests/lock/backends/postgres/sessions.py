"""What the PostgreSQL lock tests read from the server, and a client on another thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from headway.lock.backends.postgres import advisory_key

T = TypeVar("T")


async def lock_rows(engine: AsyncEngine, resource: str) -> list[bool]:
    """``granted`` of every session holding or awaiting the resource's advisory lock."""
    key = advisory_key(resource)
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND classid::bigint = :hi AND objid::bigint = :lo"
            ),
            {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF},
        )
        return [bool(granted) for (granted,) in rows]


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


def waiting(engine: AsyncEngine, resource: str, n: int = 1) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await lock_rows(engine, resource)).count(False) == n

    return check


class Elsewhere:
    """A PostgreSQL client on its own thread and loop: it acts while our loop is blocked."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` there, blocking this thread (and so our event loop) meanwhile."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
