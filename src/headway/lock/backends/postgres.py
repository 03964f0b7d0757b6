"""The PostgreSQL lock backend: transaction-level advisory locks, for apps without Redis.

A lease is one pooled connection kept in an open transaction that holds
``pg_advisory_xact_lock(key)``. Everything time-related is the server's job:

- **Waiting** happens inside the lock call, bounded by ``SET LOCAL
  lock_timeout``: no polling, and the server's lock queue is first come,
  first served. A zero timeout makes one ``pg_try_advisory_xact_lock``.
- **The TTL** is ``SET LOCAL idle_in_transaction_session_timeout``: a holder
  that stops talking (paused, hung, partitioned) for longer than its TTL has
  its session terminated, and the lock goes to the next waiter. ``extend``
  sends one cheap statement that restarts that timer (and sets the new TTL);
  the timer restarts at the end of each statement, so the server's expiry is
  never earlier than ``Lease.deadline``, which is counted from before the
  statement was sent (after a wait longer than a tenth of the TTL, one more
  statement restarts the timer, so a lease is not handed out half spent).
- **Release** rolls the transaction back: the lock is freed at once.
- **Cancellation** of a waiting ``acquire`` ends its session (the lock may
  have been granted as the cancellation arrived), so nothing is left held.
  A server ``statement_timeout`` shorter than the wait cuts it short, as a
  ``LockNotAcquired``.

The **fencing token** is the transaction's id, ``txid_current()``, taken in
the same statement *after* the lock is granted. Transaction ids come from one
counter that only moves forward (64 bits with the epoch, so no wraparound),
and the next holder can only be granted the lock after the previous holder's
transaction has ended, by which time the previous holder's id was already
assigned. So every lease on a resource gets a larger token than every earlier
lease on it. The tokens are ids of *this* server: after a failover to a
replica, or a switch between lock backends, a store may briefly reject every
write until fences catch up.

**Keys**: ``pg_advisory_xact_lock`` takes a 64-bit key, here the first 8 bytes
of a personalised BLAKE2b of the resource name. Two resources collide with
probability 2**-64; among n resources locked at the same time the chance of
any collision is about n**2 / 2**65 (one in 37 million for a million
resources). A collision only makes the two resources wait for each other; it
never lets two holders of one resource in.

Each waiting or held lease occupies one connection of ``engine``'s pool: give
the backend an engine of its own, sized for the locks held at once, and
connect directly (or through a session-pooling proxy), not through a
transaction-pooling one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Awaitable
from typing import Any

import sqlalchemy.exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from headway._clock import Clock, MonotonicClock
from headway.lock.backends.postgres_inspect import Target, read_state, session_label
from headway.lock.backends.sql_session import Held as _Held
from headway.lock.backends.sql_session import SessionLockBackend
from headway.lock.backends.sql_session import discard as _discard
from headway.lock.contract import LockBackend
from headway.lock.driver import run_to_end
from headway.lock.introspection import HolderMode, LockState
from headway.lock.lease import Lease, check_timeout, check_ttl, new_token
from headway.lock.modes import LockMode, ModeKind

__all__ = ["PostgresLockBackend", "advisory_key"]

# Materialised CTEs run in order (each reads the one before), so the settings
# are in force before the lock call and the transaction id is taken after it.
_WAIT = text("""
WITH settings AS MATERIALIZED (
    SELECT set_config('lock_timeout', :wait, true),
           set_config('idle_in_transaction_session_timeout', :ttl, true),
           set_config('application_name',
                      COALESCE(CAST(:app AS text), current_setting('application_name')), true)
), granted AS MATERIALIZED (SELECT pg_advisory_xact_lock(:key) FROM settings)
SELECT txid_current() FROM granted
""")
_TRY = text("""
WITH settings AS MATERIALIZED (
    SELECT set_config('idle_in_transaction_session_timeout', :ttl, true),
           set_config('application_name',
                      COALESCE(CAST(:app AS text), current_setting('application_name')), true)
), attempt AS MATERIALIZED (SELECT pg_try_advisory_xact_lock(:key) AS granted FROM settings)
SELECT CASE WHEN granted THEN txid_current() END FROM attempt
""")
# Any statement restarts the server's idle timer; this one also sets its new length.
_TOUCH = text("SELECT set_config('idle_in_transaction_session_timeout', :ttl, true)")

#: SQLSTATEs that end a lock wait without the lock: lock_timeout, statement_timeout.
_NOT_GRANTED = frozenset({"55P03", "57014"})
#: Errors that mean "the server is not answering (or the session is gone)".
_UNAVAILABLE = (sqlalchemy.exc.DBAPIError, sqlalchemy.exc.TimeoutError, OSError, TimeoutError)


def advisory_key(resource: str) -> int:
    """The signed 64-bit advisory-lock key of ``resource`` (BLAKE2b, personalised)."""
    digest = hashlib.blake2b(resource.encode(), digest_size=8, person=b"headway.lock").digest()
    return int.from_bytes(digest, "big", signed=True)


def _exclusive(_: bool) -> HolderMode:
    return "exclusive"


def _ms(seconds: float) -> str:
    # A setting of 0 would mean "no limit": never round a real bound down to it.
    return f"{max(1, math.ceil(seconds * 1000))}ms"


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(getattr(exc, "orig", None), "sqlstate", None)


async def _close(conn: AsyncConnection) -> None:
    await conn.close()


class PostgresLockBackend(SessionLockBackend[_Held]):
    """Locks held as PostgreSQL transaction-level advisory locks (see the module doc).

    Args:
        engine: An async SQLAlchemy engine on PostgreSQL (``postgresql+asyncpg``).
        timeout: Bounds each round trip beyond the lock wait itself, in seconds: a
            server that does not answer raises ``BackendUnavailable`` within it;
            default 2.0.
        clock: The monotonic clock of lease deadlines; default None:
            ``time.monotonic``.

    Raises:
        ValueError: The engine is not PostgreSQL's, or a bad ``timeout``.
    """

    name = "postgres"
    _server = "PostgreSQL"
    _unavailable_errors = _UNAVAILABLE
    #: Read-write locks and semaphores: ``for_mode`` (``postgres_modes.py``).
    modes: frozenset[ModeKind] = frozenset({"read", "write", "permits"})
    # The statements of one attempt, waiting and not: a mode view swaps them.
    _wait_sql = _WAIT
    _try_sql = _TRY
    _touch_sql = _TOUCH

    def __init__(
        self, engine: AsyncEngine, *, timeout: float = 2.0, clock: Clock | None = None
    ) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError(f"PostgresLockBackend needs a PostgreSQL engine, not {engine.url!r}")
        self.engine = engine
        self.timeout = check_timeout(timeout)
        self.clock: Clock = clock or MonotonicClock()
        self._held: dict[str, _Held] = {}

    def for_mode(self, mode: LockMode) -> LockBackend:
        """A backend holding resources in ``mode`` (see ``ModalLockBackend.for_mode``)."""
        from headway.lock.backends.postgres_modes import for_mode

        return for_mode(self, mode)

    def _key(self, resource: str) -> int:
        return advisory_key(resource)

    async def inspect(self, resource: str) -> LockState:
        """Who holds ``resource``'s lock, and how many wait (``InspectableLockBackend``).

        Read from ``pg_locks`` (``postgres_inspect``): ``expires_in`` is None (the TTL is
        the holder's session setting), ``owner`` the holder's session label (None where
        ``pg_stat_activity`` hides other roles' sessions).

        Args:
            resource: The lock's name.
        """
        return await read_state(self, resource, self._target(resource))

    def _target(self, resource: str) -> Target:
        return Target(self._key(resource), 1, self._key(resource), False, _exclusive)

    async def waiting(self, resource: str) -> int:
        """How many requests wait in the server's line for ``resource`` (from ``pg_locks``).

        Args:
            resource: The lock's name.
        """
        from headway.lock.backends.postgres_modes import waiting_sql  # it loads the SQL file

        async with self.engine.connect() as conn:
            params = {"key": self._key(resource), "gate_counts": False}
            return int((await conn.execute(waiting_sql(), params)).scalar_one())

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Acquire ``resource`` (see ``LockBackend.acquire``); the server does the waiting."""
        ttl_ms = check_ttl(ttl)
        wait = check_timeout(timeout)
        sent = self.clock()
        try:
            # Shielded: asyncpg cancelled mid-connect leaves a failed future behind
            # ("Future exception was never retrieved"). On cancellation the checkout
            # ends first, then the connection (which holds nothing yet) goes back.
            conn = await run_to_end(
                self._bounded(self.engine.connect().start(), wait + self.timeout), _close
            )
        except _UNAVAILABLE as exc:
            raise self._unavailable(exc) from exc
        try:
            fence = await self._request(conn, resource, ttl_ms, wait)
            if fence is not None and self.clock() - sent > ttl_ms / 1000 / 10:
                # We waited: restart the server's TTL timer from a moment we know.
                sent = self.clock()
                await self._bounded(conn.execute(_TOUCH, {"ttl": f"{ttl_ms}ms"}), self.timeout)
        except sqlalchemy.exc.DBAPIError as exc:
            if _sqlstate(exc) in _NOT_GRANTED:
                await run_to_end(self._give_back(conn))
                raise self._not_acquired(resource, timeout) from exc
            await run_to_end(_discard(conn))
            raise self._unavailable(exc) from exc
        except BaseException as exc:
            # Cancelled or timed out mid-statement: the lock may have been granted
            # meanwhile, so end the session rather than guess.
            await run_to_end(_discard(conn))
            if isinstance(exc, _UNAVAILABLE):
                raise self._unavailable(exc) from exc
            raise
        if fence is None:
            await run_to_end(self._give_back(conn))
            raise self._not_acquired(resource, timeout)
        token = new_token()
        self._held[token] = _Held(conn)
        return Lease(resource, token, int(fence), sent + ttl_ms / 1000, ttl_ms / 1000)

    async def _request(
        self, conn: AsyncConnection, resource: str, ttl_ms: int, wait: float
    ) -> int | None:
        """One statement that waits up to ``wait`` s for the lock: its fence, or None."""
        params: dict[str, Any] = {
            "key": self._key(resource),
            "ttl": f"{ttl_ms}ms",
            "app": session_label(),
        }
        if wait > 0:
            statement, params["wait"] = self._wait_sql, _ms(wait)
        else:
            statement = self._try_sql
        result = await self._bounded(conn.execute(statement, params), wait + self.timeout)
        fence = result.scalar()
        return None if fence is None else int(fence)

    def _reset(self, conn: AsyncConnection) -> Awaitable[object]:
        """Roll back a transaction that holds no lock (its connection then returns to the pool)."""
        return conn.rollback()

    def _touch_params(self, ttl_ms: int) -> dict[str, Any]:
        return {"ttl": f"{ttl_ms}ms"}

    def _unlock(self, held: _Held) -> Awaitable[object]:
        """Roll back the lease's transaction: the lock is freed at once."""
        return held.conn.rollback()
