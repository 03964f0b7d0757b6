"""Connections the asyncpg executor keeps checked out between its statements.

Checking a connection out of SQLAlchemy's pool and back costs two greenlet hops and the
pool's bookkeeping per statement: measured, ~40 % of the client CPU of a first
execution (three statements). ``Kept`` holds up to ``keep`` connections between
statements instead, on an engine the store created itself (``RecordStore.from_url``),
where nothing else needs them; 0 (the default) gives each back after its statement.

- **Fair to the pool**: the executor holds (running or kept) at most ``keep`` for long;
  a connection it checked out beyond that goes back after its statement, so callers
  waiting on the pool (the store's own SQLAlchemy statements, other tasks when the pool
  is exhausted) are served as before.
- **Closed connections** (the server restarted: asyncpg saw the socket close) are
  invalidated when taken, as the executor's checkout does with pooled ones.
- **Given back** by ``aclose`` (``RecordStore.aclose``), or when the executor is
  garbage-collected or the interpreter exits (checking in needs no I/O: the executor's
  statements leave no transaction open), so a store never closed raises no warning.
- **A forked child** never uses, nor closes, its parent's connections: they are set
  aside for good and the child checks out its own.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Awaitable, Callable

from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

__all__ = ["Kept"]

#: Connections a forked child found kept by its parent: never used nor closed there.
_PARENTS: list[PoolProxiedConnection] = []


class Kept:
    """Up to ``keep`` pooled connections held between statements."""

    def __init__(self, keep: int = 0) -> None:
        self.keep = keep
        self._idle: list[PoolProxiedConnection] = []
        self._held = 0  # checked out through this object: running a statement, or idle
        self._pid = os.getpid()
        weakref.finalize(self, _give_back, self._idle, self._pid)

    async def take(
        self, checkout: Callable[[], Awaitable[PoolProxiedConnection]]
    ) -> PoolProxiedConnection:
        """A kept connection, else a new one from ``checkout``."""
        if self._pid != os.getpid():
            self._forked()
        while self._idle:
            pooled = self._idle.pop()
            driver = pooled.driver_connection
            if driver is not None and not driver.is_closed():
                return pooled
            self._held -= 1  # closed by the server while kept: replace it
            await greenlet_spawn(pooled.invalidate)
            await greenlet_spawn(pooled.close)
        pooled = await checkout()
        self._held += 1
        return pooled

    async def put_back(self, pooled: PoolProxiedConnection) -> None:
        """Keep ``pooled`` for the next statement, or give it back to the pool."""
        if self._held <= self.keep and self._pid == os.getpid():
            self._idle.append(pooled)
            return
        await self.drop(pooled)

    async def drop(self, pooled: PoolProxiedConnection) -> None:
        """Give ``pooled`` back to the pool (after a failure: never kept)."""
        self._held -= 1
        await greenlet_spawn(pooled.close)

    async def aclose(self) -> None:
        """Give every idle connection back to the pool."""
        while self._idle:
            self._held -= 1
            await greenlet_spawn(self._idle.pop().close)

    def _forked(self) -> None:
        _PARENTS.extend(self._idle)
        self._idle.clear()  # (the list the parent's finalizer holds)
        self._idle, self._held, self._pid = [], 0, os.getpid()
        weakref.finalize(self, _give_back, self._idle, self._pid)


def _give_back(idle: list[PoolProxiedConnection], pid: int) -> None:
    """Check the idle connections in, outside the event loop (no I/O: nothing to reset)."""
    if pid != os.getpid():
        return
    while idle:
        # At interpreter exit the pool may be half torn down already: nothing to save then.
        with contextlib.suppress(Exception):
            idle.pop().close()
