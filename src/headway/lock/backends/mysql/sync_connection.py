"""What ``SyncMySQLLockBackend`` does to a pooled sync connection itself, below its
statements: bound the replies it reads (pymysql's read timeout), let ``from_url``'s
connections take several statements in one query, and end a session for good."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection

from headway.lock.backends.mysql.common import MULTI_STATEMENTS

__all__ = ["discard", "read_timeout", "several_statements"]


def discard(conn: Connection) -> None:
    """Close the connection for good: the session ends, and its locks with it."""
    with contextlib.suppress(Exception):
        conn.invalidate()
    with contextlib.suppress(Exception):
        conn.close()


def several_statements(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
    """``from_url``'s engines: each new connection takes several statements in one query."""
    cparams["client_flag"] = cparams.get("client_flag", 0) | MULTI_STATEMENTS


@contextlib.contextmanager
def read_timeout(conn: Connection, seconds: float) -> Iterator[None]:
    """Bound the replies read on ``conn`` to ``seconds`` (pymysql; another driver as is)."""
    driver = getattr(conn.connection, "driver_connection", None)
    if not hasattr(driver, "_read_timeout"):
        yield
        return
    before = driver._read_timeout  # type: ignore[union-attr]
    driver._read_timeout = seconds  # type: ignore[union-attr]
    try:
        yield
    finally:
        driver._read_timeout = before  # type: ignore[union-attr]
