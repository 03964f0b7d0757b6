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
- **Cancellation** of a waiting ``acquire`` ends the waiter's session with
  ``KILL CONNECTION`` from another connection (a closed socket alone does not end a
  ``GET_LOCK`` wait, and ``KILL QUERY`` misses a statement still on its way), then
  closes the waiter's connection: whatever the session was granted as the
  cancellation arrived is freed when it ends.

The **fencing token** comes from a counter table, ``headway_lock_fences`` (one
row per lock name), raised by the statement after the grant, on the same session:
``INSERT … SELECT … WHERE @headway_granted = 1 ON DUPLICATE KEY UPDATE`` sets
``fence = GREATEST(fence + 1, now_us + 1)`` with the server's clock in
microseconds (``SYSDATE(6)``, read after the grant) and hands it back through
``LAST_INSERT_ID`` in its reply. The next holder is granted only after the
previous holder's fence was written, so fences rise per resource; the clock floor
keeps them rising if the table is dropped, emptied or restored from a backup (as
long as the server's clock does not step back). So the table needs no migration:
it is created on first use (``CREATE TABLE IF NOT EXISTS``, which needs the CREATE
privilege) and its rows may be deleted at any time. It is created in memory
(``ENGINE = MEMORY``): the write then waits for no redo-log flush, and a restart
that empties it is one more lost counter the clock floor covers. A row the clock
has overtaken carries nothing (the floor gives at least as much), so a full table
(``max_heap_table_size``) is freed of those rows and the fence written again. The
write is a statement of its own because a MEMORY table is locked whole by a write:
a write that waited in ``GET_LOCK`` would hold up every other lock's grant (the
server runs it after the grant's statement, in the same query where it can). A
server that refuses MEMORY tables gets an InnoDB one, and a table made beforehand
is used with whatever engine it has (Group Replication needs InnoDB: see
``docs/locks.md`` for clusters). The tokens are this server's:
after a failover to a replica whose clock is behind, a store may reject writes until
fences catch up.

**Names**: ``GET_LOCK`` names are server-wide, and MySQL takes at most 64
characters and ignores case; a resource's is ``headway:`` and the first 56 hex
digits of the SHA-256 of the engine's database name and the resource
(``lock_name``), so any resource (long, any case, any character) fits, and two
databases on one server do not share locks, as PostgreSQL's advisory locks are
per database. Two resources collide with probability 2**-224.

**Round trips**: the grant is one ``SET`` that sets the session up and waits in
``GET_LOCK`` (its result kept in ``@headway_granted``), then the fence's ``INSERT``,
both in one query (one round trip) on a driver whose connections take several
statements (aiomysql's always do; ``common.GRANT_AND_FENCE``), else one after the
other; the release is one ``SET``: two round trips a lease, and the pool's rollback.

**Session settings**: a lease's session runs with ``autocommit = 1`` (a fence in an
InnoDB table is committed at once), ``time_zone = '+00:00'`` (for the clock floor) and
its TTL as ``wait_timeout``, and the fence passes through ``LAST_INSERT_ID``; the
values it had are saved in user variables (by the grant's ``SET``) and put back
before the connection returns to the pool.

Each waiting or held lease occupies one connection of ``engine``'s pool: give
the backend an engine of its own, sized for the locks held at once (plus one
connection for a ``KILL CONNECTION`` when a wait is cancelled). The server's
``thread_handling`` must be one thread per connection (the default): under a
thread pool, ``wait_timeout`` is checked on a coarse timer.

Statements, names, the grant's steps and the error mapping live in ``common``, shared
with ``SyncMySQLLockBackend``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy.exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from headway._clock import Clock
from headway.lock.backends.mysql import common
from headway.lock.backends.mysql.common import (
    GIVE_BACK,
    NOT_GRANTED,
    RELEASE,
    RELEASE_DIRECT,
    SESSION_ID,
    TOUCH,
    UNAVAILABLE,
    Reply,
    Step,
    lock_name,
    reply,
    seconds,
)
from headway.lock.backends.sql_session import Held, SessionLockBackend
from headway.lock.backends.sql_session import discard as _discard
from headway.lock.backends.windows import WindowClaims
from headway.lock.driver import run_to_end
from headway.lock.introspection import LockState
from headway.lock.lease import Lease, check_timeout, check_ttl, new_token

__all__ = ["MySQLLockBackend"]

T = TypeVar("T")


@dataclass
class _Held(Held):
    #: The lock's name, for ``RELEASE_LOCK``.
    name: str = ""
    #: The driver's connection, when its own cursor sends the release (``_direct``).
    driver: Any = None


class MySQLLockBackend(WindowClaims, common.Common, SessionLockBackend[_Held]):
    """Locks held as MySQL/MariaDB user-level locks (see the module doc).

    ``run_once`` windows are claimed in a table instead (``WindowClaimBackend``:
    ``claim_window`` and ``end_window``, see ``headway.lock.backends.windows``), so they
    outlive a runner that dies.

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

    _unavailable_errors = UNAVAILABLE
    _touch_sql = TOUCH

    def __init__(
        self, engine: AsyncEngine, *, timeout: float = 2.0, clock: Clock | None = None
    ) -> None:
        super().__init__(engine, timeout, clock)
        self.engine = engine
        self._held: dict[str, _Held] = {}

    async def _run(self, conn: AsyncConnection, driver: Any, steps: Generator[Step, Reply, T]) -> T:
        """Run ``steps`` (a flow from ``common``) on ``conn`` (``driver``: its driver's
        connection if it takes several statements in one query, else None)."""
        step = next(steps)
        while True:
            try:
                done = await self._bounded(
                    self._step(conn, driver, step), step.extra + self.timeout
                )
            except sqlalchemy.exc.DBAPIError as exc:
                try:
                    step = steps.throw(exc)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                continue
            try:
                step = steps.send(done)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]

    async def _step(self, conn: AsyncConnection, driver: Any, step: Step) -> Reply:
        if not step.paired:
            assert step.statement is not None
            return reply(await conn.execute(step.statement, step.params))
        # Several statements in one query: on the driver's own cursor, as SQLAlchemy's
        # result reads the first statement's reply only.
        return await self._direct(conn, driver, step.paired, step.params)

    async def _direct(
        self, conn: AsyncConnection, driver: Any, sql: str, params: dict[str, Any]
    ) -> Reply:
        """Run ``sql`` (its statements one after the other, in one query) on ``driver``'s
        own cursor; the last statement's reply. Errors are wrapped as SQLAlchemy wraps
        them (a lost connection invalidated), for the flows and the callers."""
        cursor = await driver.cursor()
        try:
            await cursor.execute(sql, params)
            while await cursor.nextset():
                pass
        except self._dialect.loaded_dbapi.Error as exc:
            error, lost = self._wrapped(exc, sql, params, cursor)
            if lost:
                await conn.invalidate()
            raise error from exc
        done = Reply(int(cursor.rowcount or 0), int(cursor.lastrowid or 0))
        await cursor.close()
        return done

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Acquire ``resource`` (see ``LockBackend.acquire``); the server does the waiting."""
        ttl_ms = check_ttl(ttl)
        wait = check_timeout(timeout)
        name = lock_name(resource, self.database)
        sent = self.clock()
        for retry in (True, False):
            conn, session, driver = await self._checkout(wait)
            try:
                grant = common.grant(name, wait, ttl_ms, paired=driver is not None)
                fence = await self._run(conn, driver, grant)
                if fence and common.waited(sent, self.clock(), ttl_ms):
                    # We waited: restart the server's TTL timer from a moment we know.
                    sent = self.clock()
                    touch = conn.execute(TOUCH, {"ttl": seconds(ttl_ms)})
                    await self._bounded(touch, self.timeout)
            except common.StaleSession as exc:
                await run_to_end(self._abandon(conn, session))
                if retry:
                    continue
                raise self._unavailable(exc.__cause__ or exc) from exc
            except sqlalchemy.exc.DBAPIError as exc:
                # A failed statement may have been granted the lock: end the session.
                await run_to_end(_discard(conn))
                if common.errno(exc) in NOT_GRANTED:
                    raise self._not_acquired(resource, timeout) from exc
                raise self._unavailable(exc) from exc
            except BaseException as exc:
                # Cancelled or timed out mid-statement: the server may still be waiting,
                # or have granted the lock meanwhile. Interrupt it, then end the session.
                await run_to_end(self._abandon(conn, session))
                if isinstance(exc, UNAVAILABLE):
                    raise self._unavailable(exc) from exc
                raise
            break
        if not fence:
            await run_to_end(self._give_back(conn))
            raise self._not_acquired(resource, timeout)
        token = new_token()
        self._held[token] = _Held(conn, name=name, driver=driver)
        return Lease(resource, token, fence, sent + ttl_ms / 1000, ttl_ms / 1000)

    async def inspect(self, resource: str) -> LockState:
        """Who holds ``resource``'s lock, and how many wait (``InspectableLockBackend``).

        The holder's ``owner`` and ``expires_in`` are None: the server keeps no token,
        and the TTL is the holder's session setting. Waiters are counted from the process
        list: without the PROCESS privilege, only this user's.

        Args:
            resource: The lock's name.
        """
        params = {"name": lock_name(resource, self.database)}
        try:
            async with self.engine.connect() as conn:
                try:
                    found = await self._bounded(conn.execute(common.INSPECT, params), self.timeout)
                except sqlalchemy.exc.DBAPIError as exc:
                    if common.errno(exc) != common.NO_SUCH_TABLE:
                        raise
                    await conn.rollback()
                    unfenced = conn.execute(common.INSPECT_UNFENCED, params)
                    found = await self._bounded(unfenced, self.timeout)
                return common.lock_state(resource, found.one())
        except UNAVAILABLE as exc:
            raise self._unavailable(exc) from exc

    async def _checkout(self, wait: float) -> tuple[AsyncConnection, int, Any]:
        """A pooled connection, its session id (``KILL CONNECTION`` needs it) and, if it
        takes several statements in one query, its driver's connection (else None); it
        holds nothing yet, and its settings are the pool's."""
        try:
            # Shielded: on cancellation the checkout ends first, then the connection
            # goes back to the pool.
            return await run_to_end(self._open(wait), self._close_opened)
        except UNAVAILABLE as exc:
            raise self._unavailable(exc) from exc

    async def _open(self, wait: float) -> tuple[AsyncConnection, int, Any]:
        conn = await self._bounded(self.engine.connect().start(), wait + self.timeout)
        try:
            driver = (await conn.get_raw_connection()).driver_connection
            paired = common.takes_several(driver)
            return conn, await self._session_id(conn, driver), driver if paired else None
        except BaseException:
            await _discard(conn)
            raise

    async def _close_opened(self, opened: tuple[AsyncConnection, int, Any]) -> None:
        await opened[0].close()

    async def _session_id(self, conn: AsyncConnection, driver: Any) -> int:
        """The server's id of ``conn``'s session (``KILL CONNECTION`` needs it): aiomysql has it
        from the handshake; another driver is asked once."""
        thread_id = getattr(driver, "thread_id", None)
        if callable(thread_id):
            return int(thread_id())
        return int((await self._bounded(conn.execute(SESSION_ID), self.timeout)).scalar_one())

    async def _abandon(self, conn: AsyncConnection, session: int) -> None:
        """End a session whose lock statement we stopped reading, leaving nothing held."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.timeout), self.engine.connect() as killer:
                # A closed socket does not end a GET_LOCK wait: the server must be told.
                await killer.execute(common.kill(session))
                # KILL returns before the session ends, which holds its lock till then,
                # and nothing tells when it ends: ask, so that a cancelled acquire has
                # left nothing behind once it raises.
                alive = {"session": session}
                while (await killer.execute(common.SESSION_ALIVE, alive)).scalar_one():  # noqa: ASYNC110
                    await asyncio.sleep(0.001)
        await _discard(conn)

    def _reset(self, conn: AsyncConnection) -> Awaitable[object]:
        """Restore the settings of a session that holds no lock (before it returns to the pool)."""
        return conn.execute(GIVE_BACK)

    def _touch_params(self, ttl_ms: int) -> dict[str, Any]:
        return {"ttl": seconds(ttl_ms)}

    def _unlock(self, held: _Held) -> Awaitable[object]:
        """``RELEASE_LOCK``, in the statement that restores the session's settings: on the
        driver's own cursor where the grant went (it needs no result, and skips
        SQLAlchemy's statement handling, docs/decisions/lock.md)."""
        if held.driver is not None:
            return self._direct(held.conn, held.driver, RELEASE_DIRECT, {"name": held.name})
        return held.conn.execute(RELEASE, {"name": held.name})
