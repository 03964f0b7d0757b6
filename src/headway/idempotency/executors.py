"""How the store runs its prebuilt statements: the one seam between a record operation
and the database driver.

An ``Executor`` runs one prebuilt SQLAlchemy statement with named parameters as one
round trip (autocommitted on PostgreSQL), on a connection from the store's engine, and
answers by position: ``first`` the first row (or None), ``rowcount`` the rows changed.
The SQL is defined once, as SQLAlchemy statements; an executor only decides how it
travels. ``executor_for`` picks one per engine when the store is built:

- ``SqlAlchemyExecutor`` (every dialect): ``conn.execute`` through the engine.
- ``AsyncpgExecutor`` (``postgresql+asyncpg``): each statement compiled once for the
  engine's dialect (``$n`` SQL and the positional order of its parameters) and run on
  the asyncpg connection of a connection checked out from the engine's pool, which
  caches it as a prepared statement. It skips SQLAlchemy's per-execution work (~0.1 ms
  of client CPU per statement); SQLAlchemy's ``before_cursor_execute`` events do not
  see these statements. A connection the driver reports broken is invalidated in the
  pool and the operation raises ``BackendUnavailable``, as the engine's own path does.
  On an engine the store created, it keeps its connections checked out between
  statements (``kept.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.util import greenlet_spawn

from headway._errors import BackendUnavailable
from headway.idempotency.kept import Kept

__all__ = ["AsyncpgExecutor", "Executor", "SqlAlchemyExecutor", "executor_for"]

Params = dict[str, Any]


class Executor:
    """Runs a prebuilt statement as one round trip; the contract every executor keeps."""

    #: Names the executor (in ``repr``s and tests).
    name = "executor"

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def first(self, statement: Executable, params: Params) -> Sequence[Any] | None:
        """The first row ``statement`` returns, by position; None if it returns none."""
        raise NotImplementedError

    async def rowcount(self, statement: Executable, params: Params) -> int:
        """How many rows ``statement`` changed."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Give back whatever connections the executor holds between statements."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class SqlAlchemyExecutor(Executor):
    """Statements through SQLAlchemy's execution: every dialect."""

    name = "sqlalchemy"

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        # On PostgreSQL one statement runs autocommitted: no BEGIN and COMMIT round trips,
        # and its async drivers switch that with a flag, not a command. Elsewhere switching
        # would cost round trips (MySQL) or a thread hop (SQLite), while their implicit
        # transaction costs no more than a plain connection's.
        self._autocommit = engine.dialect.name == "postgresql"
        self._single = (
            engine.execution_options(isolation_level="AUTOCOMMIT") if self._autocommit else engine
        )

    async def first(self, statement: Executable, params: Params) -> Sequence[Any] | None:
        if self._autocommit:
            async with self._single.connect() as conn:
                return (await conn.execute(statement, params)).first()
        async with self.engine.begin() as conn:
            return (await conn.execute(statement, params)).first()

    async def rowcount(self, statement: Executable, params: Params) -> int:
        if self._autocommit:
            async with self._single.connect() as conn:
                return int((await conn.execute(statement, params)).rowcount)
        async with self.engine.begin() as conn:
            return int((await conn.execute(statement, params)).rowcount)


#: One positional argument: the caller's parameter name, and the statement's own value
#: (already processed) when the caller does not give it; the bind's processor, if any.
_Argument = tuple[str, Any, Callable[[Any], Any] | None]


class AsyncpgExecutor(Executor):
    """Prebuilt statements on the asyncpg connection of one from the engine's pool."""

    name = "asyncpg"

    def __init__(self, engine: AsyncEngine, keep: int = 0) -> None:
        super().__init__(engine)
        #: The connections kept checked out between statements (``kept.py``).
        self.kept = Kept(keep)
        # Keyed by the statement itself (SQLAlchemy statements hash and compare by
        # identity): the store's statements are module constants, a handful of entries.
        self._compiled: dict[Executable, tuple[str, tuple[_Argument, ...]]] = {}
        #: Statements sent on driver connections (tests read it; a plain int add).
        self.sent = 0

    def _prepare(self, statement: Executable) -> tuple[str, tuple[_Argument, ...]]:
        entry = self._compiled.get(statement)
        if entry is None:
            dialect = self.engine.dialect
            compiled = cast(SQLCompiler, cast(ClauseElement, statement).compile(dialect=dialect))
            arguments = []
            for name in compiled.positiontup or ():
                bind = compiled.binds[name]
                process = bind.type.dialect_impl(dialect).bind_processor(dialect)
                own = bind.effective_value
                arguments.append((name, own if process is None else process(own), process))
            entry = self._compiled[statement] = (compiled.string, tuple(arguments))
        return entry

    @staticmethod
    def _arguments(arguments: tuple[_Argument, ...], params: Params) -> list[Any]:
        values = []
        for name, own, process in arguments:
            if name in params:
                value = params[name]
                values.append(value if process is None else process(value))
            else:
                values.append(own)
        return values

    async def first(self, statement: Executable, params: Params) -> Sequence[Any] | None:
        sql, arguments = self._prepare(statement)
        row = await self._call(True, sql, self._arguments(arguments, params))
        return None if row is None else tuple(row)

    async def rowcount(self, statement: Executable, params: Params) -> int:
        sql, arguments = self._prepare(statement)
        status = await self._call(False, sql, self._arguments(arguments, params))
        # The command tag: "UPDATE 1", "DELETE 0", "INSERT 0 1": the count comes last.
        return int(status.rpartition(" ")[2])

    async def _call(self, fetch: bool, sql: str, values: list[Any]) -> Any:
        """``fetchrow`` (``fetch``) or ``execute`` on a pooled connection's driver.

        The pooled connection is checked out raw (no SQLAlchemy ``Connection`` around it:
        a third less client CPU per statement), or kept from the last statement, and given
        back the way SQLAlchemy gives it back (its reset finds no transaction: none was
        begun, the statement autocommitted).
        """
        pooled = await self.kept.take(self._checkout)
        try:
            driver: Any = pooled.driver_connection
            self.sent += 1
            result = await (
                driver.fetchrow(sql, *values) if fetch else driver.execute(sql, *values)
            )
        except BaseException as exc:
            try:
                await _on_failure(pooled, exc)
            finally:
                await self.kept.drop(pooled)
            raise
        await self.kept.put_back(pooled)
        return result

    async def aclose(self) -> None:
        await self.kept.aclose()

    async def _checkout(self) -> PoolProxiedConnection:
        """A pooled connection; one the driver already knows is closed (its socket saw EOF,
        e.g. after a server restart) is replaced at no round trip."""
        while True:
            try:
                pooled = await self.engine.raw_connection()
            except _disconnects() as exc:  # the pool connects raw: no SQLAlchemy wrapping
                message = f"database unavailable: {exc}"
                raise BackendUnavailable(message, backend="database") from exc
            driver = pooled.driver_connection
            if driver is not None and not driver.is_closed():
                return pooled
            await greenlet_spawn(pooled.invalidate)
            await greenlet_spawn(pooled.close)


#: asyncpg's errors for a connection that cannot be used any more (the server's own
#: errors about a query, like a missing table, are not among them and propagate).
_DISCONNECTS: tuple[type[BaseException], ...] | None = None


def _disconnects() -> tuple[type[BaseException], ...]:
    global _DISCONNECTS
    if _DISCONNECTS is None:
        import asyncpg.exceptions as pg

        _DISCONNECTS = (
            pg.InterfaceError,  # closed, or another operation in progress
            pg.PostgresConnectionError,  # SQLSTATE class 08
            pg.AdminShutdownError,
            pg.CrashShutdownError,
            pg.CannotConnectNowError,
            pg.IdleSessionTimeoutError,
            OSError,
        )
    return _DISCONNECTS


async def _on_failure(pooled: PoolProxiedConnection, exc: BaseException) -> None:
    """Invalidate a connection the driver left unusable; a lost one is ``BackendUnavailable``.

    A statement interrupted (the store's timeout, a cancelled request) may still be
    running on the connection, so that connection is discarded rather than reused.
    """
    lost = isinstance(exc, _disconnects())
    if lost or isinstance(exc, asyncio.CancelledError | TimeoutError):
        error = exc if isinstance(exc, Exception) else None
        await asyncio.shield(greenlet_spawn(pooled.invalidate, error))
    if lost:
        raise BackendUnavailable(f"database connection lost: {exc}", backend="database") from exc


def executor_for(engine: AsyncEngine, driver: bool = True, keep: int = 0) -> Executor:
    """The executor for ``engine``: with ``driver``, the driver path on
    ``postgresql+asyncpg`` (unless the engine translates schema names), keeping up to
    ``keep`` connections between statements; SQLAlchemy's execution elsewhere."""
    dialect = engine.dialect
    # A schema translate map is applied by SQLAlchemy's execution, which the driver skips.
    translated = engine.get_execution_options().get("schema_translate_map")
    if driver and dialect.name == "postgresql" and dialect.driver == "asyncpg" and not translated:
        return AsyncpgExecutor(engine, keep)
    return SqlAlchemyExecutor(engine)
