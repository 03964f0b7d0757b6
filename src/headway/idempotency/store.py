"""``RecordStore``: the idempotency records over an async SQLAlchemy engine.

Every write that decides something is a compare-and-set on the fencing token,
so a worker whose lease was taken over cannot finish, release or overwrite the
newer worker's record; each write reports whether it was accepted.
"""

from __future__ import annotations

import asyncio
import enum
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from headway._errors import BackendUnavailable
from headway.idempotency.table import Status, db_now, metadata, records

__all__ = ["Claim", "ClaimOutcome", "Record", "RecordStore", "StoredResponse"]

T = TypeVar("T")

#: Database errors that mean "cannot answer now" rather than "you asked wrongly".
UNAVAILABLE: tuple[type[BaseException], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,  # pool checkout
    OSError,
    TimeoutError,
)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A response as kept in a record; ``body`` is None when it was too large to keep."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    """One idempotency record (live, i.e. not expired)."""

    scope: str
    key: str
    fingerprint: str
    status: Status
    fence: int
    response: StoredResponse | None


class ClaimOutcome(enum.Enum):
    """What ``claim`` found."""

    CLAIMED = "claimed"  # the record is ours, PROCESSING with our fence: run the request
    COMPLETED = "completed"  # already done with this fingerprint: replay ``record``
    MISMATCH = "mismatch"  # the key belongs to a different request
    BUSY = "busy"  # a newer or live holder has it


@dataclass(frozen=True, slots=True)
class Claim:
    """The result of ``RecordStore.claim``."""

    outcome: ClaimOutcome
    record: Record | None = None
    #: On CLAIMED: the fencing token the record now carries (the caller's, or the store's pick).
    fence: int | None = None


def _record(row: sa.Row[*tuple[Any, ...]]) -> Record:
    response = None
    if row.response_status is not None:
        headers = tuple((str(k), str(v)) for k, v in row.response_headers or ())
        response = StoredResponse(row.response_status, headers, row.response_body)
    return Record(row.scope, row.key, row.fingerprint, Status(row.status), int(row.fence), response)


_STATUSES = {status.value: status for status in Status}


def _read(row: sa.Row[*tuple[Any, ...]], scope: str, key: str) -> Record:
    """A ``_GET`` row as a Record (unpacked by position: Row attributes cost more)."""
    fingerprint, status, fence, response_status, headers, body = row
    response = None
    if response_status is not None:
        pairs = tuple([(str(k), str(v)) for k, v in headers or ()])
        response = StoredResponse(response_status, pairs, body)
    return Record(scope, key, fingerprint, _STATUSES[status], int(fence), response)


#: ``get``'s statement, built once: SQLAlchemy memoizes a statement object's cache key,
#: whereas building the same SELECT per call cost more client CPU than the query itself.
#: It reads only the columns an answer needs; scope and key are the caller's own.
_GET = sa.select(
    records.c.fingerprint,
    records.c.status,
    records.c.fence,
    records.c.response_status,
    records.c.response_headers,
    records.c.response_body,
).where(
    records.c.scope == sa.bindparam("scope"),
    records.c.key == sa.bindparam("key"),
    records.c.expires_at > db_now(),
)


def _where(scope: str, key: str) -> sa.ColumnElement[bool]:
    return sa.and_(records.c.scope == scope, records.c.key == key)


def _ours(scope: str, key: str, fence: int) -> sa.ColumnElement[bool]:
    """The record, still PROCESSING under our fencing token: every fenced write's condition."""
    return sa.and_(
        _where(scope, key),
        records.c.fence == fence,
        records.c.status == Status.PROCESSING.value,
    )


class RecordStore:
    """Idempotency records in SQL (PostgreSQL, SQLite, MySQL/MariaDB).

    ``ttl`` is how long a record is kept (and replayed), in seconds, counted on
    the database's clock. Every operation is bounded by ``timeout`` seconds; a
    database that is down or too slow raises ``BackendUnavailable(backend="database")``.
    """

    def __init__(self, engine: AsyncEngine, *, ttl: float = 24 * 3600, timeout: float = 5.0):
        if ttl <= 0 or timeout <= 0:
            raise ValueError("ttl and timeout must be > 0")
        self.engine = engine
        self.ttl = float(ttl)
        self.timeout = float(timeout)
        # Reads are one statement each. On PostgreSQL they run autocommitted: no BEGIN and
        # COMMIT round trips, and its async drivers switch that with a flag, not a command.
        # Elsewhere switching would cost round trips (MySQL) or a thread hop (SQLite),
        # while their implicit transaction costs no more than a plain connection's.
        self._reader = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if engine.dialect.name == "postgresql"
            else engine
        )

    @classmethod
    def from_url(cls, url: str, *, create_table: bool | None = None, **options: Any) -> RecordStore:
        """A store on a new engine for ``url``.

        ``create_table`` (default: only for SQLite, the embedded setup) creates
        the table on first use; elsewhere run ``headway migrate``.
        """
        is_sqlite = url.startswith("sqlite")
        engine = create_async_engine(
            url, connect_args={"timeout": 30} if is_sqlite else {}, pool_pre_ping=not is_sqlite
        )
        store = cls(engine, **options)
        store._create = is_sqlite if create_table is None else create_table
        return store

    _create = False

    async def create_table(self) -> None:
        """Create the table if missing (tests, embedded use); production uses migrations."""
        async with self.engine.begin() as conn:
            await conn.run_sync(metadata.create_all)

    async def _run(self, op: Callable[[AsyncConnection], Awaitable[T]], *, read: bool = False) -> T:
        """``op`` in a transaction (``read``: on a reading connection), within ``timeout``."""
        try:
            async with asyncio.timeout(self.timeout):
                if self._create:
                    self._create = False
                    await self.create_table()
                if read:
                    async with self._reader.connect() as conn:
                        return await op(conn)
                async with self.engine.begin() as conn:
                    return await op(conn)
        except UNAVAILABLE as exc:
            raise BackendUnavailable(f"database unavailable: {exc}", backend="database") from exc
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                raise BackendUnavailable(
                    f"database connection lost: {exc}", backend="database"
                ) from exc
            raise

    async def get(self, scope: str, key: str) -> Record | None:
        """The live record for (scope, key), or None. One primary-key SELECT."""

        async def op(conn: AsyncConnection) -> Record | None:
            row = (await conn.execute(_GET, {"scope": scope, "key": key})).first()
            return None if row is None else _read(row, scope, key)

        return await self._run(op, read=True)

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
        returned for replay. A different fingerprint gives MISMATCH.
        """
        values = {
            "fingerprint": fingerprint,
            "status": Status.PROCESSING.value,
            "lease_token": lease_token,
            "lease_expires_at": db_now(lease_ttl),
            "response_status": None,
            "response_headers": None,
            "response_body": None,
            "created_at": db_now(),
            "expires_at": db_now(self.ttl),
        }

        async def op(conn: AsyncConnection) -> Claim:
            first = _first_fence() if fence is None else fence
            inserted = await conn.execute(
                _insert_ignore(conn).values(scope=scope, key=key, fence=first, **values)
            )
            if inserted.rowcount == 1:
                return Claim(ClaimOutcome.CLAIMED, fence=first)
            now = db_now()
            query = sa.select(
                records,
                (records.c.expires_at <= now).label("expired"),
                sa.or_(
                    records.c.lease_expires_at.is_(None), records.c.lease_expires_at <= now
                ).label("lease_over"),
            ).where(_where(scope, key))
            row = (await conn.execute(query)).first()
            if row is None:
                return Claim(ClaimOutcome.BUSY)  # purged meanwhile: the caller may retry
            current = _record(row)
            if not row.expired:
                if current.fingerprint != fingerprint:
                    return Claim(ClaimOutcome.MISMATCH, current)
                if current.status is Status.COMPLETED:
                    return Claim(ClaimOutcome.COMPLETED, current)
                if not row.lease_over or (fence is not None and fence <= current.fence):
                    return Claim(ClaimOutcome.BUSY, current)
            mine = current.fence + 1 if fence is None else fence
            # Take over: only if the row is still exactly what we decided on.
            taken = await conn.execute(
                records.update()
                .where(
                    _where(scope, key),
                    records.c.fence == current.fence,
                    records.c.status == current.status.value,
                )
                .values(fence=mine, **values)
            )
            if taken.rowcount == 1:
                return Claim(ClaimOutcome.CLAIMED, fence=mine)
            return Claim(ClaimOutcome.BUSY)

        return await self._run(op)

    async def renew(self, scope: str, key: str, fence: int, lease_ttl: float) -> bool:
        """Extend our PROCESSING record's lease to ``lease_ttl`` s from now (database clock).

        False if the record is no longer ours (taken over, released or completed).
        """
        update = (
            records.update()
            .where(_ours(scope, key, fence))
            .values(lease_expires_at=db_now(lease_ttl))
        )

        async def op(conn: AsyncConnection) -> bool:
            return (await conn.execute(update)).rowcount == 1

        return await self._run(op)

    async def complete(self, scope: str, key: str, fence: int, response: StoredResponse) -> bool:
        """Store ``response`` and mark the record COMPLETED, only if ``fence`` still owns it.

        Returns whether the write was accepted; False means a newer lease took
        the record over (or it was released), and nothing was written.
        """
        update = (
            records.update()
            .where(_ours(scope, key, fence))
            .values(
                status=Status.COMPLETED.value,
                lease_token=None,
                lease_expires_at=None,
                response_status=response.status,
                response_headers=[list(h) for h in response.headers],
                response_body=response.body,
                expires_at=db_now(self.ttl),
            )
        )

        async def op(conn: AsyncConnection) -> bool:
            return (await conn.execute(update)).rowcount == 1

        return await self._run(op)

    async def release(self, scope: str, key: str, fence: int) -> bool:
        """Delete our PROCESSING record so a retry runs again; False if it is not ours."""
        delete = records.delete().where(_ours(scope, key, fence))

        async def op(conn: AsyncConnection) -> bool:
            return (await conn.execute(delete)).rowcount == 1

        return await self._run(op)

    async def purge(self, *, batch_size: int = 1000) -> int:
        """Delete expired records in batches of ``batch_size``; return how many."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        expired = records.c.expires_at <= db_now()
        pick = sa.select(records.c.scope, records.c.key).where(expired).limit(batch_size)

        async def op(conn: AsyncConnection) -> tuple[int, int]:
            keys = [tuple(row) for row in (await conn.execute(pick)).all()]
            if not keys:
                return 0, 0
            # Re-checked in the DELETE: a record taken over meanwhile is not expired any more.
            delete = records.delete().where(
                sa.tuple_(records.c.scope, records.c.key).in_(keys), expired
            )
            return len(keys), (await conn.execute(delete)).rowcount

        total = 0
        while True:
            picked, deleted = await self._run(op)
            total += deleted
            if picked < batch_size:
                return total

    async def aclose(self) -> None:
        """Dispose of the engine's connections."""
        await self.engine.dispose()


def _first_fence() -> int:
    """A fencing token for a record claimed without a lock lease.

    Random (so a stale worker's token never matches a later claim's) and below
    2**40, far under the lock's tokens (floored by the clock in microseconds, about
    1.7e15), so a lock holder can always take such a record over once its lease ends.
    """
    return secrets.randbelow(1 << 40) + 1


def _insert_ignore(conn: AsyncConnection) -> Any:
    """INSERT that does nothing (rowcount 0) when the primary key exists."""
    name = conn.dialect.name
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(records).on_conflict_do_nothing(index_elements=["scope", "key"])
    if name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(records).on_conflict_do_nothing(index_elements=["scope", "key"])
    return records.insert().prefix_with("IGNORE")  # MySQL / MariaDB
