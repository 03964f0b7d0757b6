"""The engine ``RecordStore.from_url`` makes: its pool's defaults, and how many of its
connections the store keeps checked out between statements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

__all__ = ["SERVER_ENGINE", "SQLITE_ENGINE", "keepable", "options_for"]

#: ``from_url``'s engine on a database server: no connection opened and closed per
#: request under concurrency (SQLAlchemy's default, 5 + 10 overflow, churned one per
#: request beyond five in flight); docs/decisions/idempotency.md has the numbers.
SERVER_ENGINE: dict[str, Any] = {"pool_size": 20, "max_overflow": 0}
#: SQLite: one writer at a time, so writers wait for the file lock rather than fail.
SQLITE_ENGINE: dict[str, Any] = {"connect_args": {"timeout": 30}}


def options_for(is_sqlite: bool, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options for ``create_async_engine``: the defaults, replaced key by key by
    ``given`` (a ``poolclass`` given replaces the pool sizes: they are the queue pool's)."""
    # No pool_pre_ping: it would add a round trip to each of a first execution's three
    # statements. A connection cut by an outage fails its request (503, Retry-After)
    # and SQLAlchemy then replaces every connection older than the failure.
    given = dict(given or {})
    defaults = SQLITE_ENGINE if is_sqlite else {} if "poolclass" in given else SERVER_ENGINE
    return {**defaults, **given}


def keepable(engine: AsyncEngine, options: Mapping[str, Any]) -> int:
    """How many connections ``from_url``'s store keeps between statements: all but two of
    its pool (for its statements that go through SQLAlchemy: forget, purge), and none
    where the options ask the pool to check connections (recycle, pre-ping) or not to
    pool them at all."""
    checks = {"pool_recycle", "pool_pre_ping", "poolclass"} & options.keys()
    if checks or not isinstance(engine.pool, QueuePool):
        return 0
    return max(0, engine.pool.size() - 2)
