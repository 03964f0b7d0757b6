"""``RecordStore``: the idempotency records over an async SQLAlchemy engine.

Each operation is one statement (autocommitted on PostgreSQL: no BEGIN and COMMIT
round trips; purge and MySQL's claim are a transaction), bounded by the store's
timeout, with outages reported as
``BackendUnavailable(backend="database")``. What the statements are lives beside
it: ``claim`` (taking a record), ``writes`` (settling it) and ``record`` (values);
how they travel, ``executors`` (the asyncpg driver on PostgreSQL, else SQLAlchemy).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from headway._clock import within
from headway._errors import BackendUnavailable
from headway.idempotency import writes
from headway.idempotency.claim import claim_record, claim_statement, claimed, one_statement
from headway.idempotency.executors import Executor, SqlAlchemyExecutor, executor_for
from headway.idempotency.record import GET, Claim, Record, StoredResponse, read
from headway.idempotency.table import metadata

__all__ = ["RecordStore"]

T = TypeVar("T")

#: Database errors that mean "cannot answer now" rather than "you asked wrongly".
UNAVAILABLE: tuple[type[BaseException], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,  # pool checkout
    OSError,
    TimeoutError,
)


class RecordStore:
    """Idempotency records in SQL (PostgreSQL, SQLite, MySQL/MariaDB).

    ``ttl`` is how long a record is kept (and replayed), in seconds, counted on
    the database's clock. Every operation is bounded by ``timeout`` seconds; a
    database that is down or too slow raises ``BackendUnavailable(backend="database")``.
    On ``postgresql+asyncpg`` the hot statements run on the driver connection (half the
    client CPU); ``driver=False`` keeps them in SQLAlchemy's execution, where its
    ``before_cursor_execute`` events (tracing, metrics) see them.
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
        #: How the prebuilt statements (get, claim, the fenced writes) travel.
        self.executor: Executor = executor_for(engine, driver)
        # Statements built per call (forget) go through SQLAlchemy on every dialect.
        self._sqlalchemy = (
            self.executor
            if isinstance(self.executor, SqlAlchemyExecutor)
            else SqlAlchemyExecutor(engine)
        )

    @classmethod
    def from_url(cls, url: str, *, create_table: bool | None = None, **options: Any) -> RecordStore:
        """A store on a new engine for ``url``.

        ``create_table`` (default: only for SQLite, the embedded setup) creates
        the table on first use; elsewhere run ``headway migrate``.
        """
        is_sqlite = url.startswith("sqlite")
        # No pool_pre_ping: it would add a round trip to each of a first execution's three
        # statements. A connection cut by an outage fails its request (503, Retry-After)
        # and SQLAlchemy then replaces every connection older than the failure.
        engine = create_async_engine(url, connect_args={"timeout": 30} if is_sqlite else {})
        store = cls(engine, **options)
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
        """``op()`` within ``timeout``, outages mapped to ``BackendUnavailable``."""
        try:
            if self._create:
                return await within(self.timeout, self._after_table(op))
            return await within(self.timeout, op())
        except UNAVAILABLE as exc:
            raise BackendUnavailable(f"database unavailable: {exc}", backend="database") from exc
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                raise BackendUnavailable(
                    f"database connection lost: {exc}", backend="database"
                ) from exc
            raise

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

    async def get(self, scope: str, key: str) -> Record | None:
        """The live record for (scope, key), or None. One primary-key SELECT."""
        row = await self._run(lambda: self.executor.first(GET, {"scope": scope, "key": key}))
        return None if row is None else read(row, scope, key)

    async def claim(
        self,
        scope: str,
        key: str,
        fingerprint: str,
        *,
        fence: int | None,
        lease_token: str,
        lease_ttl: float,
    ) -> Claim:
        """Insert the record as PROCESSING with ``fence`` and a lease, or take it over.

        ``fence`` is the fencing token of the lock lease the caller holds, or
        None when the database alone provides exclusion (the primary key does;
        the store then picks the token). The record's lease lasts ``lease_ttl``
        seconds on the database clock; keep it alive with ``renew``. An expired
        record is replaced; a PROCESSING record whose lease ran out (its worker
        died or stalled) is taken over with a newer token; a COMPLETED one is
        returned for replay. A different fingerprint gives MISMATCH; a live holder BUSY,
        with ``lease_left``. One statement (one round trip) on PostgreSQL, SQLite and
        MariaDB.
        """
        if not one_statement(self.engine.dialect):

            async def steps(conn: AsyncConnection) -> Claim:
                return await claim_record(
                    conn, scope, key, fingerprint,
                    fence=fence, lease_token=lease_token, lease_ttl=lease_ttl, ttl=self.ttl,
                )  # fmt: skip

            return await self._transaction(steps)
        statement, params, mark = claim_statement(
            self.engine.dialect, scope, key, fingerprint,
            fence=fence, lease_token=lease_token, lease_ttl=lease_ttl, ttl=self.ttl,
        )  # fmt: skip
        row = await self._run(lambda: self.executor.first(statement, params))
        if row is None:  # RETURNING gives the row whether the claim inserted, took over or not
            raise RuntimeError("the claiming statement returned no row")
        return claimed(row, mark, scope, key, fingerprint)

    async def renew(self, scope: str, key: str, fence: int, lease_ttl: float) -> bool:
        """Extend our PROCESSING record's lease to ``lease_ttl`` s from now (database clock).

        False if the record is no longer ours (taken over, released or completed).
        """
        return await self._accepted(writes.renew(scope, key, fence, lease_ttl))

    async def complete(self, scope: str, key: str, fence: int, response: StoredResponse) -> bool:
        """Store ``response`` and mark the record COMPLETED, only if ``fence`` still owns it.

        Returns whether the write was accepted; False means a newer lease took
        the record over (or it was released), and nothing was written.
        """
        return await self._accepted(writes.complete(scope, key, fence, response, self.ttl))

    async def release(self, scope: str, key: str, fence: int) -> bool:
        """Delete our PROCESSING record so a retry runs again; False if it is not ours."""
        return await self._accepted(writes.release(scope, key, fence))

    async def forget(self, scope: str, key: str, *, force: bool = False) -> bool:
        """Delete the record of (scope, key) so the key runs again; whether one was removed.

        For support staff letting a customer retry. A record still in flight
        (PROCESSING under a live lease) is kept unless ``force``: removing it would let
        a retry run while the first execution still runs. Even forced, that first
        execution cannot store its result afterwards (its fenced write finds no record).
        """
        return await self._accepted(writes.forget(scope, key, force=force), self._sqlalchemy)

    async def purge(self, *, batch_size: int = 1000) -> int:
        """Delete expired records in batches of ``batch_size``; return how many."""
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
        await self.engine.dispose()
