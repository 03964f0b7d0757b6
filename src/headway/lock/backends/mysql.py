"""The MySQL/MariaDB lock backend: user-level locks (``GET_LOCK``), for apps without Redis.

A lease is one pooled connection whose session holds ``GET_LOCK(name)``. A
user-level lock belongs to the session that took it and is freed when that
session ends; a session that asks again for a name it holds gets it again
(the locks stack), so a connection holding a lease is never used for another.
Everything time-related is the server's job:

- **Waiting** happens inside ``GET_LOCK(name, timeout)`` (fractions of a second
  are honoured): no polling. A release hands the lock to a waiter inside the
  server, so the releaser cannot cut in; MariaDB and MySQL promise no order, but
  their metadata-lock queue grants waiters in the order they came (measured on
  MariaDB 10.11, see ``docs/decisions/lock.md``). A zero timeout makes one attempt.
- **The TTL** is the session's ``wait_timeout``, set to the TTL rounded *up* to
  whole seconds (the variable's unit): a holder that stops talking (paused,
  hung, partitioned) for that long has its session closed by the server, and
  the lock goes to a waiter. ``extend`` sends one statement that sets the new
  TTL and restarts the idle timer (it restarts after every statement), so the
  server's expiry is never earlier than ``Lease.deadline``, counted from before
  the statement was sent. A sub-second TTL is held for a whole second on the
  server; the holder's deadline still says the TTL asked for.
- **Release** is ``RELEASE_LOCK`` on the lease's own session, in the statement
  that restores the session's settings before the connection goes back to the pool.
- **Cancellation** of a waiting ``acquire`` interrupts the server-side wait with
  ``KILL QUERY`` from another connection (a closed socket alone does not end a
  ``GET_LOCK`` wait), then closes the waiter's connection: whatever the session
  was granted as the cancellation arrived is freed when it ends.

The **fencing token** comes from a counter table, ``headway_lock_fences`` (one
row per lock name), raised in the same statement as the grant, after it:
``INSERT … SELECT … WHERE GET_LOCK(…) = 1 ON DUPLICATE KEY UPDATE`` sets
``fence = GREATEST(fence + 1, now_us + 1)`` with the server's clock in
microseconds (``SYSDATE(6)``, read after the grant) and hands it back through
``LAST_INSERT_ID`` in the same reply. The next holder is granted only after
the previous holder's statement committed, so fences rise per resource; the
clock floor keeps them rising if the table is dropped, truncated or restored
from a backup (as long as the server's clock does not step back). So the
table needs no migration: it is created on first use (``CREATE TABLE IF NOT
EXISTS``, which needs the CREATE privilege) and its rows may be deleted at any
time. The tokens are this server's: after a failover to a replica whose clock
is behind, a store may reject writes until fences catch up.

**Names**: ``GET_LOCK`` names are server-wide, and MySQL takes at most 64
characters and ignores case; a resource's is ``headway:`` and the first 56 hex
digits of the SHA-256 of the engine's database name and the resource
(``lock_name``), so any resource (long, any case, any character) fits, and two
databases on one server do not share locks, as PostgreSQL's advisory locks are
per database. Two resources collide with probability 2**-224.

**Session settings**: a lease's session runs with ``autocommit = 1`` (the fence
is committed with the grant), ``time_zone = '+00:00'`` (for the clock floor) and
its TTL as ``wait_timeout``, and the fence passes through ``LAST_INSERT_ID``; the
values it had are saved in user variables and put back before the connection
returns to the pool.

Each waiting or held lease occupies one connection of ``engine``'s pool: give
the backend an engine of its own, sized for the locks held at once (plus one
connection for a ``KILL QUERY`` when a wait is cancelled). The server's
``thread_handling`` must be one thread per connection (the default): under a
thread pool, ``wait_timeout`` is checked on a coarse timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy.exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from headway._clock import Clock, MonotonicClock
from headway._errors import BackendUnavailable, LockNotAcquired, LockNotOwned
from headway.lock.driver import run_to_end
from headway.lock.lease import Lease, check_timeout, check_ttl, new_token

__all__ = ["FENCE_TABLE", "MySQLLockBackend", "lock_name"]

T = TypeVar("T")

#: The counter table of fencing tokens, in the engine's database.
FENCE_TABLE = "headway_lock_fences"

_CREATE = text("""
CREATE TABLE IF NOT EXISTS headway_lock_fences (
    name CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    fence BIGINT UNSIGNED NOT NULL
) ENGINE = InnoDB
""")
# Every expression of a SET is evaluated before any variable is assigned, so the
# saved values are the session's own.
_SETUP = text("""
SET @headway_autocommit = @@session.autocommit,
    @headway_last_insert_id = LAST_INSERT_ID(),
    @headway_time_zone = @@session.time_zone,
    @headway_wait_timeout = @@session.wait_timeout,
    SESSION autocommit = 1, SESSION time_zone = '+00:00', SESSION wait_timeout = :ttl
""")
# One row of DUAL passes the WHERE only once GET_LOCK granted the lock; only then
# are the SELECT list and the UPDATE evaluated (SYSDATE is read then, unlike NOW).
# rowcount: 0 not granted, 1 first fence of this name, 2 raised; lastrowid: the fence.
_GRANT = text("""
INSERT INTO headway_lock_fences (name, fence)
SELECT :name, LAST_INSERT_ID(CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS UNSIGNED) + 1)
FROM DUAL WHERE GET_LOCK(:name, :wait) = 1
ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(
    GREATEST(fence + 1, CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS UNSIGNED) + 1)
)
""")
# Any statement restarts the server's idle timer; this one also sets its new length.
_TOUCH = text("SET SESSION wait_timeout = :ttl")
_RESTORE = """
    @headway_last_insert_id = LAST_INSERT_ID(@headway_last_insert_id),
    SESSION autocommit = @headway_autocommit,
    SESSION time_zone = @headway_time_zone,
    SESSION wait_timeout = @headway_wait_timeout
"""
_GIVE_BACK = text(f"SET {_RESTORE}")
# A live session holds its lock (only its end or its own RELEASE_LOCK frees it), so
# the statement succeeding is the answer; its result is not needed.
_RELEASE = text(f"SET @headway_released = RELEASE_LOCK(:name), {_RESTORE}")

#: Error numbers that end a lock wait without the lock: a deadlock among user-level
#: locks (MariaDB ER_LOCK_DEADLOCK, MySQL 8 ER_USER_LOCK_DEADLOCK), a statement time
#: limit (MariaDB max_statement_time, MySQL max_execution_time).
_NOT_GRANTED = frozenset({1213, 3058, 1969, 3024})
_NO_SUCH_TABLE = 1146
#: Errors that mean "the server is not answering (or the session is gone)".
_UNAVAILABLE = (sqlalchemy.exc.DBAPIError, sqlalchemy.exc.TimeoutError, OSError, TimeoutError)


def lock_name(resource: str, database: str = "") -> str:
    """The ``GET_LOCK`` name of ``resource`` in ``database``: 64 characters, lower case."""
    digest = hashlib.sha256(f"{database}\0{resource}".encode()).hexdigest()
    return f"headway:{digest[:56]}"


def _seconds(ttl_ms: int) -> int:
    # wait_timeout counts whole seconds (at least 1): round up, never below the TTL.
    return max(1, math.ceil(ttl_ms / 1000))


def _errno(exc: BaseException) -> int | None:
    args = getattr(getattr(exc, "orig", None), "args", ())
    return args[0] if args and isinstance(args[0], int) else None


@dataclass
class _Held:
    conn: AsyncConnection
    name: str
    # One connection runs one statement at a time: extend and release queue here.
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)


async def _discard(conn: AsyncConnection) -> None:
    """Close the connection for good: the session ends, and its locks with it."""
    with contextlib.suppress(Exception):
        await conn.invalidate()
    with contextlib.suppress(Exception):
        await conn.close()


class MySQLLockBackend:
    """Locks held as MySQL/MariaDB user-level locks (see the module doc).

    Args:
        engine: An async SQLAlchemy engine on MySQL or MariaDB (``mysql+aiomysql``).
        timeout: Bounds each round trip beyond the lock wait itself, in seconds: a
            server that does not answer raises ``BackendUnavailable`` within it;
            default 2.0.
        clock: The monotonic clock of lease deadlines; default None:
            ``time.monotonic``.

    Raises:
        ValueError: The engine is neither MySQL's nor MariaDB's, or a bad ``timeout``.
    """

    name = "mysql"

    def __init__(
        self, engine: AsyncEngine, *, timeout: float = 2.0, clock: Clock | None = None
    ) -> None:
        if engine.dialect.name not in ("mysql", "mariadb"):
            raise ValueError(
                f"MySQLLockBackend needs a MySQL or MariaDB engine, not {engine.url!r}"
            )
        self.engine = engine
        self.timeout = check_timeout(timeout)
        self.clock: Clock = clock or MonotonicClock()
        self.database = engine.url.database or ""
        self._held: dict[str, _Held] = {}

    def _unavailable(self, exc: BaseException) -> BackendUnavailable:
        return BackendUnavailable(
            f"MySQL failed or did not answer within {self.timeout:g} s: "
            f"{type(exc).__name__}: {exc}",
            backend="mysql",
        )

    async def _bounded(self, aw: Awaitable[T], seconds: float) -> T:
        async with asyncio.timeout(seconds):
            return await aw

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Acquire ``resource`` (see ``LockBackend.acquire``); the server does the waiting."""
        ttl_ms = check_ttl(ttl)
        wait = check_timeout(timeout)
        name = lock_name(resource, self.database)
        sent = self.clock()
        conn, session = await self._checkout(wait, ttl_ms)
        try:
            fence = await self._grant(conn, name, wait)
            if fence and self.clock() - sent > ttl_ms / 1000 / 10:
                # We waited: restart the server's TTL timer from a moment we know.
                sent = self.clock()
                await self._bounded(conn.execute(_TOUCH, {"ttl": _seconds(ttl_ms)}), self.timeout)
        except sqlalchemy.exc.DBAPIError as exc:
            # A failed statement may have been granted the lock: end the session.
            await run_to_end(_discard(conn))
            if _errno(exc) in _NOT_GRANTED:
                raise self._not_acquired(resource, timeout) from exc
            raise self._unavailable(exc) from exc
        except BaseException as exc:
            # Cancelled or timed out mid-statement: the server may still be waiting,
            # or have granted the lock meanwhile. Interrupt it, then end the session.
            await run_to_end(self._abandon(conn, session))
            if isinstance(exc, _UNAVAILABLE):
                raise self._unavailable(exc) from exc
            raise
        if not fence:
            await run_to_end(self._give_back(conn))
            raise self._not_acquired(resource, timeout)
        token = new_token()
        self._held[token] = _Held(conn, name)
        return Lease(resource, token, fence, sent + ttl_ms / 1000, ttl_ms / 1000)

    async def _checkout(self, wait: float, ttl_ms: int) -> tuple[AsyncConnection, int]:
        """A pooled connection set up for a lease of ``ttl_ms``, and its session id; it
        holds nothing yet."""
        for retry in (True, False):
            try:
                # Shielded: on cancellation the checkout and the setup end first, then
                # the connection goes back to the pool as it was.
                return await run_to_end(self._open(wait, ttl_ms), self._give_back_opened)
            except sqlalchemy.exc.DBAPIError as exc:
                # A pooled connection the server closed meanwhile (a restart, an idle
                # timeout): SQLAlchemy invalidated it; a fresh one is worth one more try.
                if not (retry and exc.connection_invalidated):
                    raise self._unavailable(exc) from exc
            except _UNAVAILABLE as exc:
                raise self._unavailable(exc) from exc
        raise AssertionError("unreachable")

    async def _open(self, wait: float, ttl_ms: int) -> tuple[AsyncConnection, int]:
        conn = await self._bounded(self.engine.connect().start(), wait + self.timeout)
        try:
            await self._bounded(conn.execute(_SETUP, {"ttl": _seconds(ttl_ms)}), self.timeout)
            return conn, await self._session_id(conn)
        except BaseException:
            await _discard(conn)
            raise

    async def _give_back_opened(self, opened: tuple[AsyncConnection, int]) -> None:
        await self._give_back(opened[0])

    async def _grant(self, conn: AsyncConnection, name: str, wait: float) -> int:
        """The fence if the lock was granted within ``wait`` s, else 0."""
        params: dict[str, Any] = {"name": name, "wait": wait}
        try:
            result = await self._bounded(conn.execute(_GRANT, params), wait + self.timeout)
        except sqlalchemy.exc.DBAPIError as exc:
            if _errno(exc) != _NO_SUCH_TABLE:
                raise
            # The table is opened before GET_LOCK runs: nothing was granted. First use.
            await self._bounded(conn.execute(_CREATE), self.timeout)
            result = await self._bounded(conn.execute(_GRANT, params), wait + self.timeout)
        return int(result.lastrowid or 0) if result.rowcount else 0

    async def _session_id(self, conn: AsyncConnection) -> int:
        """The server's id of ``conn``'s session (``KILL QUERY`` needs it): aiomysql has it
        from the handshake; another driver is asked once."""
        raw = await conn.get_raw_connection()
        thread_id = getattr(raw.driver_connection, "thread_id", None)
        if callable(thread_id):
            return int(thread_id())
        query = conn.execute(text("SELECT CONNECTION_ID()"))
        return int((await self._bounded(query, self.timeout)).scalar_one())

    async def _abandon(self, conn: AsyncConnection, session: int) -> None:
        """End a session whose lock statement we stopped reading, leaving nothing held."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.timeout), self.engine.connect() as killer:
                # A closed socket does not end a GET_LOCK wait: the server must be told.
                await killer.execute(text(f"KILL QUERY {session}"))
        await _discard(conn)

    async def _give_back(self, conn: AsyncConnection) -> None:
        """Restore the settings of a session that holds no lock and return it to the pool."""
        try:
            await self._bounded(conn.execute(_GIVE_BACK), self.timeout)
        except _UNAVAILABLE:
            await _discard(conn)
        else:
            await conn.close()

    def _not_acquired(self, resource: str, timeout: float) -> LockNotAcquired:
        return LockNotAcquired(
            f"lock {resource!r} not acquired within {timeout:g} s", resource=resource
        )

    def _not_owned(self, lease: Lease, what: str, why: str = "") -> LockNotOwned:
        return LockNotOwned(
            f"cannot {what} lock {lease.resource!r}: the lease (fence {lease.fence}) is "
            f"no longer held{why}",
            resource=lease.resource,
        )

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        """Renew ``lease`` for ``ttl`` s from now; ``LockNotOwned`` if its session ended."""
        ttl_ms = check_ttl(ttl)
        held = self._held.get(lease.token)
        if held is None:
            raise self._not_owned(lease, "extend")
        async with held.busy:
            if self._held.get(lease.token) is not held:
                raise self._not_owned(lease, "extend")
            sent = self.clock()
            # Past the lease's deadline the server may end the session anyway: a touch
            # that cannot answer by then counts as lost (and ``hold()`` hears of it in time).
            left = lease.deadline - sent
            bound = min(self.timeout, left) if left > 0 else self.timeout
            try:
                # Shielded: a statement abandoned halfway would leave the session unusable.
                await run_to_end(self._touch(lease.token, held, ttl_ms, bound))
            except _UNAVAILABLE as exc:
                why = f" ({type(exc).__name__}: its session ended or did not answer)"
                raise self._not_owned(lease, "extend", why) from exc
        return lease.renewed(ttl_ms, sent)

    async def _touch(self, token: str, held: _Held, ttl_ms: int, bound: float) -> None:
        try:
            await self._bounded(held.conn.execute(_TOUCH, {"ttl": _seconds(ttl_ms)}), bound)
        except BaseException:
            # A session that failed a statement cannot be trusted to hold anything:
            # end it, so the lock is freed for certain.
            self._held.pop(token, None)
            await _discard(held.conn)
            raise

    async def release(self, lease: Lease) -> None:
        """Release ``lease`` (shielded from cancellation); ``LockNotOwned`` if it had lapsed."""
        held = self._held.pop(lease.token, None)
        if held is None:
            raise self._not_owned(lease, "release")
        try:
            await run_to_end(self._end(held))
        except TimeoutError as exc:
            # The session was closed from our side: the server frees the lock when it notices.
            raise self._unavailable(exc) from exc
        except _UNAVAILABLE as exc:
            raise self._not_owned(lease, "release", " (its session had ended)") from exc

    async def _end(self, held: _Held) -> None:
        async with held.busy:
            try:
                await self._bounded(held.conn.execute(_RELEASE, {"name": held.name}), self.timeout)
            except BaseException:
                await _discard(held.conn)
                raise
            await held.conn.close()

    async def aclose(self) -> None:
        """Release every lease still held (their sessions end; the engine stays yours)."""
        held, self._held = list(self._held.values()), {}
        for h in held:
            await run_to_end(_discard(h.conn))
