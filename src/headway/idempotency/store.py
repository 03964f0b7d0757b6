"""``RecordStore``: the idempotency records over an async SQLAlchemy engine.

Each operation is one statement (autocommitted on PostgreSQL: no BEGIN and COMMIT
round trips; purge and MySQL's claim are a transaction), bounded by the store's
timeout, with outages reported as ``BackendUnavailable(backend="database")``
(``outages``). What the statements are lives beside it: ``claim`` (taking a record),
``writes`` (settling it), ``rows`` (reading it) and ``record`` (values); how they
travel, ``executors`` (the asyncpg driver on PostgreSQL, else SQLAlchemy); the engine
``from_url`` makes, ``store_engine``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from headway._clock import within
from headway._database import create_engine, parse
from headway.idempotency import writes
from headway.idempotency.claim import claim_record, claim_statement, claimed, one_statement
from headway.idempotency.executors import (
    AsyncpgExecutor,
    Executor,
    SqlAlchemyExecutor,
    executor_for,
)
from headway.idempotency.outages import Outages
from headway.idempotency.record import Claim, ForgetOutcome, Record, RecordState, StoredResponse
from headway.idempotency.rows import GET, INSPECT, read, read_state
from headway.idempotency.store_engine import keepable, options_for
from headway.idempotency.table import metadata

__all__ = ["RecordStore"]

T = TypeVar("T")


class RecordStore:
    """Idempotency records in SQL (PostgreSQL, SQLite, MySQL/MariaDB): the built-in
    ``RecordBackend``, plus what operators need (``inspect``, ``forget``, ``purge``,
    ``aclose``).

    A database that is down or too slow raises ``BackendUnavailable(backend="database")``;
    a missing table ``DatabaseNotMigrated``.

    Args:
        engine: An async SQLAlchemy engine (``from_url`` makes one).
        ttl: How long a record is kept (and replayed), in seconds, counted on the
            database's clock; default 86,400 (a day).
        timeout: The bound on every operation, in seconds; default 5.0.
        driver: On ``postgresql+asyncpg``, run the hot statements on the driver
            connection (half the client CPU); default True. False keeps them in
            SQLAlchemy's execution, where its ``before_cursor_execute`` events
            (tracing, metrics) see them.

    Raises:
        ValueError: ``ttl`` or ``timeout`` <= 0.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        ttl: float = 24 * 3600,
        timeout: float = 5.0,
        driver: bool = True,
    ):
        if ttl <= 0 or timeout <= 0:
            raise ValueError("ttl and timeout must be > 0")
        self.engine = engine
        self.ttl = float(ttl)
        self.timeout = float(timeout)
        self._outages = Outages(engine.url)
        #: How the prebuilt statements (get, claim, the fenced writes) travel.
        self.executor: Executor = executor_for(engine, driver)
        # Statements built per call (forget) go through SQLAlchemy on every dialect.
        self._sqlalchemy = (
            self.executor
            if isinstance(self.executor, SqlAlchemyExecutor)
            else SqlAlchemyExecutor(engine)
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        ttl: float = 24 * 3600,
        timeout: float = 5.0,
        driver: bool = True,
        create_table: bool | None = None,
        engine_options: Mapping[str, Any] | None = None,
    ) -> RecordStore:
        """A store on a new engine for ``url``, an async SQLAlchemy URL.

        Pool sizing: on PostgreSQL and MySQL/MariaDB the engine keeps up to
        ``pool_size=20`` connections and opens no overflow (``max_overflow=0``). Each
        statement holds a connection only while it runs, so 20 serve every request one
        event loop keeps in flight, none is opened and closed per request, and a
        connection opened once stays. Twenty per process means five processes fill
        PostgreSQL's default ``max_connections=100``: with more processes (or beside a
        large app pool) pass ``engine_options={"pool_size": 10}``, or use PgBouncer.
        SQLite keeps SQLAlchemy's own pool. ``engine_options`` go to
        ``create_async_engine`` and replace these defaults key by key (a ``poolclass``
        replaces them all). On ``postgresql+asyncpg`` the store keeps all but two of the
        pool checked out between its statements (no pool round per statement), unless
        the options ask for ``pool_pre_ping``, ``pool_recycle`` or another ``poolclass``;
        ``aclose`` gives them back.

        Args:
            url: An async SQLAlchemy URL (``postgresql+asyncpg://...``,
                ``sqlite+aiosqlite:///file``, ``mysql+aiomysql://...``).
            ttl: How long a record is kept, in seconds; default a day.
            timeout: The bound on every operation, in seconds; default 5.0.
            driver: As for the constructor; default True.
            create_table: Create the table on first use; default None: only for
                SQLite (the embedded setup). Elsewhere run ``headway migrate``.
            engine_options: Keyword arguments for ``create_async_engine``, replacing
                the defaults above key by key; default None.

        Raises:
            ValueError: A URL it cannot use (a sync driver, not a URL), saying which
                to use; or ``ttl`` or ``timeout`` <= 0.
            ImportError: The URL's driver is not installed (the message names the
                extra).
        """
        parsed = parse(url)
        is_sqlite = parsed.get_backend_name() == "sqlite"
        options = options_for(is_sqlite, engine_options)
        engine = create_engine(parsed, **options)
        store = cls(engine, ttl=ttl, timeout=timeout, driver=driver)
        if isinstance(store.executor, AsyncpgExecutor):  # the engine is the store's alone
            store.executor.kept.keep = keepable(engine, options)
        store._create = is_sqlite if create_table is None else create_table
        return store

    _create = False

    async def create_table(self) -> None:
        """Create the table if missing (tests, embedded use); production uses migrations."""
        async with self.engine.begin() as conn:
            await conn.run_sync(metadata.create_all)

    _creating: asyncio.Future[None] | None = None

    async def _table_ready(self) -> None:
        """Create an embedded store's table once; calls that arrive meanwhile wait for it
        (clearing the flag first let them query a table that did not exist yet)."""
        creating = self._creating
        if creating is None or (creating.done() and creating.exception() is not None):
            creating = self._creating = asyncio.ensure_future(self.create_table())
        await asyncio.shield(creating)
        self._create = False

    async def _run(self, op: Callable[[], Awaitable[T]]) -> T:
        """``op()`` within ``timeout``, outages mapped to ``BackendUnavailable`` and a
        missing table to ``DatabaseNotMigrated``."""
        try:
            if self._create:
                return await within(self.timeout, self._after_table(op))
            return await within(self.timeout, op())
        except Exception as exc:
            unavailable = self._outages.unavailable(exc)
            if unavailable is None:
                raise
            raise unavailable from exc

    async def _after_table(self, op: Callable[[], Awaitable[T]]) -> T:
        await self._table_ready()
        return await op()

    async def _transaction(self, op: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``op`` in one transaction, within ``timeout``."""

        async def run() -> T:
            async with self.engine.begin() as conn:
                return await op(conn)

        return await self._run(run)

    async def _accepted(self, write: writes.Write, executor: Executor | None = None) -> bool:
        """Run a fenced write; whether it changed the record (one row)."""
        run = (executor or self.executor).rowcount
        return await self._run(lambda: run(*write)) == 1

    async def get(self, caller: str, key: str) -> Record | None:
        """The live record for (caller, key), or None. One primary-key SELECT.

        What the middleware replays from: the stored response, body and headers
        included (``RecordBackend.get`` documents the arguments). To show a record to an
        operator, ``inspect``.
        """
        row = await self._run(lambda: self.executor.first(GET, {"scope": caller, "key": key}))
        return None if row is None else read(row, caller, key)

    async def inspect(self, caller: str, key: str) -> RecordState | None:
        """What an operator may see of the live record for (caller, key), or None.

        Its status, times, fingerprint and fence, and the stored response's status code
        and size, never its body or headers: the database measures the body, which never
        leaves it (``headway record`` prints this). An expired record, not yet purged,
        is None, as for ``get``.

        Args:
            caller: Whose record: the HTTP caller's id or the function's namespace id.
            key: The idempotency key.

        Raises:
            BackendUnavailable: The database is down or slower than ``timeout``.
            DatabaseNotMigrated: The records table does not exist.
        """
        params = {"scope": caller, "key": key}
        row = await self._run(lambda: self._sqlalchemy.first(INSPECT, params))
        return None if row is None else read_state(row, caller, key)

    async def claim(
        self,
        caller: str,
        key: str,
        fingerprint: str,
        *,
        lease_token: str,
        lease_ttl: float,
        fence: int | None = None,
    ) -> Claim:
        """Insert the record as PROCESSING with ``fence`` and a lease, or take it over.

        ``fence`` is the fencing token of a lock lease a caller of its own holds, or
        None (the default, and ``RecordBackend``'s rule, which the engine follows): the
        database picks the token, and the primary key provides exclusion. The record's
        lease lasts ``lease_ttl`` seconds on the database clock; keep it alive with
        ``renew``. An expired record is replaced; a PROCESSING record whose lease ran
        out (its worker died or stalled) is taken over with a newer token; a COMPLETED
        one is returned for replay. A different fingerprint gives MISMATCH; a live
        holder BUSY, with ``lease_left``. One statement (one round trip) on PostgreSQL,
        SQLite and MariaDB.

        Args:
            caller: Whose record: the HTTP caller's id or the function's namespace id.
            key: The idempotency key.
            fingerprint: What the request (or call) is, to tell a retry from a reuse.
            lease_token: The claiming worker's lease token.
            lease_ttl: The record's lease in seconds, on the database clock.
            fence: A fencing token of the caller's own; default None: the database
                picks it.

        Raises:
            BackendUnavailable: The database is down or slower than ``timeout``.
            DatabaseNotMigrated: The records table does not exist.
            RuntimeError: The claiming statement returned no row (a bug: its
                ``RETURNING`` answers whether it inserted, took over or not).
        """
        if not one_statement(self.engine.dialect):

            async def steps(conn: AsyncConnection) -> Claim:
                return await claim_record(
                    conn, caller, key, fingerprint,
                    fence=fence, lease_token=lease_token, lease_ttl=lease_ttl, ttl=self.ttl,
                )  # fmt: skip

            return await self._transaction(steps)
        statement, params, mark = claim_statement(
            self.engine.dialect, caller, key, fingerprint,
            fence=fence, lease_token=lease_token, lease_ttl=lease_ttl, ttl=self.ttl,
        )  # fmt: skip
        row = await self._run(lambda: self.executor.first(statement, params))
        if row is None:  # RETURNING gives the row whether the claim inserted, took over or not
            raise RuntimeError("the claiming statement returned no row")
        return claimed(row, mark, caller, key, fingerprint)

    async def renew(self, caller: str, key: str, fence: int, lease_ttl: float) -> bool:
        """Extend our PROCESSING record's lease to ``lease_ttl`` s from now (database clock).

        False if the record is no longer ours (taken over, released or completed).
        """
        return await self._accepted(writes.renew(caller, key, fence, lease_ttl))

    async def complete(self, caller: str, key: str, fence: int, response: StoredResponse) -> bool:
        """Store ``response`` and mark the record COMPLETED, only if ``fence`` still owns it.

        Returns whether the write was accepted; False means a newer lease took
        the record over (or it was released), and nothing was written.
        """
        return await self._accepted(writes.complete(caller, key, fence, response, self.ttl))

    async def release(self, caller: str, key: str, fence: int) -> bool:
        """Delete our PROCESSING record so a retry runs again; False if it is not ours."""
        return await self._accepted(writes.release(caller, key, fence))

    async def forget(self, caller: str, key: str, *, force: bool = False) -> ForgetOutcome:
        """Delete the record of (caller, key) so the key runs again; say what was found.

        For support staff letting a customer retry. A record still in flight
        (PROCESSING under a live lease) is kept unless ``force`` (``IN_FLIGHT``): removing
        it would let a retry run while the first execution still runs. Even forced, that
        first execution cannot store its result afterwards (its fenced write finds no
        record). Only ``REMOVED`` is true, as the bool this returned before.

        Args:
            caller: Whose record: the HTTP caller's id or the function's namespace id
                (the ``scope`` column; ``headway forget --caller``).
            key: The idempotency key.
            force: Delete a record still in flight too; default False.

        Raises:
            BackendUnavailable: The database is down or slower than ``timeout``.
        """
        if await self._accepted(writes.forget(caller, key, force=force), self._sqlalchemy):
            return ForgetOutcome.REMOVED
        # Not removed: without force, a live record left is one in flight (the DELETE
        # takes completed, lease-expired and expired records).
        if not force and await self.get(caller, key) is not None:
            return ForgetOutcome.IN_FLIGHT
        return ForgetOutcome.NOT_FOUND

    async def purge(self, *, batch_size: int = 1000) -> int:
        """Delete expired records, one transaction per batch; return how many.

        Args:
            batch_size: Records deleted per transaction (>= 1); default 1000.

        Raises:
            ValueError: ``batch_size`` < 1.
            BackendUnavailable: The database is down or slower than ``timeout``.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")

        async def op(conn: AsyncConnection) -> tuple[int, int]:
            return await writes.purge_batch(conn, batch_size)

        total = 0
        while True:
            picked, deleted = await self._transaction(op)
            total += deleted
            if picked < batch_size:
                return total

    async def aclose(self) -> None:
        """Dispose of the engine's connections."""
        await self.executor.aclose()
        await self.engine.dispose()
