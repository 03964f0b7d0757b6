"""Counting the statements an engine sends, whichever way they travel.

SQLAlchemy's ``before_cursor_execute`` sees the statements it executes; the store's
asyncpg executor runs its statements on the driver, which SQLAlchemy never sees, so
each asyncpg connection the pool hands out also gets a query logger (asyncpg calls it
once per statement it ran itself; SQLAlchemy's own prepared statements do not log).
"""

from __future__ import annotations

import asyncio
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["Statements"]

_TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK")


class Statements:
    """What ``engine`` sent: each statement's first word, whether it ran outside a
    transaction (autocommitted), and how many went on the asyncpg driver directly."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.sent: list[str] = []
        self.autocommitted: list[bool] = []
        self.on_driver = 0
        #: Transactions SQLAlchemy began (each a BEGIN and a COMMIT/ROLLBACK round trip).
        self.transactions = 0
        self._logged: set[int] = set()
        sa.event.listen(engine.sync_engine, "before_cursor_execute", self._statement)
        sa.event.listen(engine.sync_engine, "begin", self._begin)
        sa.event.listen(engine.sync_engine.pool, "checkout", self._checkout)

    @property
    def round_trips(self) -> int:
        return len(self.sent) + 2 * self.transactions

    async def settled(self) -> Statements:
        """Itself, once asyncpg has called its loggers (it schedules them with ``call_soon``
        when a statement ends, so the last one is reported after one pass of the loop)."""
        await asyncio.sleep(0)
        return self

    def clear(self) -> None:
        self.sent.clear()
        self.autocommitted.clear()
        self.on_driver = self.transactions = 0

    def _statement(self, conn: sa.Connection, cursor: Any, statement: str, *_: Any) -> None:
        self.sent.append(statement.split(None, 1)[0])
        dbapi = conn.connection.dbapi_connection
        self.autocommitted.append(bool(getattr(dbapi, "autocommit", False)))

    def _begin(self, conn: sa.Connection) -> None:
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            self.transactions += 1

    def _checkout(self, dbapi: Any, record: Any, proxy: Any) -> None:
        driver = proxy.driver_connection
        if not hasattr(driver, "add_query_logger") or id(driver) in self._logged:
            return
        self._logged.add(id(driver))

        def logged(query: Any) -> None:
            word = query.query.split(None, 1)[0].rstrip(";").upper()
            if word not in _TRANSACTION_CONTROL:  # SQLAlchemy's, counted by ``_begin``
                self.sent.append(word)
                self.autocommitted.append(not driver.is_in_transaction())
                self.on_driver += 1

        driver.add_query_logger(logged)
