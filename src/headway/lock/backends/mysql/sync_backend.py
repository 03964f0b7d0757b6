"""The synchronous MySQL/MariaDB lock backend: ``MySQLLockBackend``'s twin for threads.

It sends the same statements and runs the same grant (``common``) over a sync
SQLAlchemy engine (``mysql+pymysql://…``, the driver the ``mysql`` extra brings):
one pooled session per lease, ``GET_LOCK`` waiting in the server, the TTL as the
session's ``wait_timeout``, the fence raised after the grant, in the grant's query
where the connection takes several statements (``from_url`` makes such an engine;
pymysql's connections otherwise take one). See ``backend`` for the design; what
differs:

- **Bounded round trips**: a thread cannot be cancelled, so each statement's reply
  is bounded by the socket's read timeout, set for that statement (pymysql's
  ``read_timeout``): ``timeout`` for a plain statement, the lock wait plus
  ``timeout`` for the grant. A timed-out grant may still be waiting (or granted) on
  the server: it is interrupted with ``KILL CONNECTION`` from another connection, waited
  for until the session has ended, and closed, as a cancelled async waiter's. Another
  driver's statements are bounded only by what its own connect arguments say. Checking
  a connection out waits as long as the engine's ``pool_timeout``.
- **An interrupted call** (``KeyboardInterrupt`` in a waiting thread) ends the same
  way: the wait is interrupted and the session closed, so nothing is left behind.
- Extend and release of one lease from two threads (``SyncLock.hold``'s renewals)
  take turns on the lease's connection.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy.exc
from sqlalchemy import Connection, Engine, TextClause, create_engine, event

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
from headway.lock.backends.mysql.sync_connection import discard, read_timeout, several_statements
from headway.lock.backends.windows import SyncWindowClaims
from headway.lock.introspection import LockState
from headway.lock.lease import Lease, check_timeout, check_ttl, new_token

__all__ = ["SyncMySQLLockBackend"]

T = TypeVar("T")


@dataclass
class _Held:
    conn: Connection
    name: str
    driver: Any  # the driver's connection when it takes several statements, else None
    # One connection runs one statement at a time: extend and release queue here.
    busy: threading.Lock = field(default_factory=threading.Lock)


class SyncMySQLLockBackend(SyncWindowClaims, common.Common):
    """Locks held as MySQL/MariaDB user-level locks, for threads (see the module doc).

    ``run_once`` windows are claimed in a table instead (``SyncWindowClaimBackend``, see
    ``headway.lock.backends.windows``), so they outlive a runner that dies.

    Args:
        engine: A sync SQLAlchemy engine of its own (``mysql+pymysql``), its pool
            sized for the locks held or waited for at once (plus one connection for
            a ``KILL CONNECTION``).
        timeout: Bounds each round trip beyond the lock wait itself, in seconds: a
            server that does not answer raises ``BackendUnavailable`` within it;
            default 2.0.
        clock: The monotonic clock of lease deadlines; default None:
            ``time.monotonic``.

    Raises:
        ValueError: The engine is neither MySQL's nor MariaDB's, or a bad ``timeout``.
    """

    _unavailable_errors = UNAVAILABLE

    def __init__(self, engine: Engine, *, timeout: float = 2.0, clock: Clock | None = None) -> None:
        super().__init__(engine, timeout, clock)
        self.engine = engine
        self._held: dict[str, _Held] = {}
        self._owns_engine = False

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 2.0, clock: Clock | None = None, **engine_options: Any
    ) -> SyncMySQLLockBackend:
        """A backend on an engine of its own for ``url``, which ``close()`` disposes of;
        other keyword arguments go to ``sqlalchemy.create_engine`` (``pool_size``: the
        locks held or waited for at once, plus one).

        Over pymysql its connections take several statements in one query
        (``CLIENT_MULTI_STATEMENTS``, as aiomysql's always do), so the fence travels with
        the grant: two round trips a lease instead of three. The backend sends only its
        own statements, with bound parameters; run no SQL of your own on its ``engine``.

        Args:
            url: The server's SQLAlchemy URL (``mysql+pymysql://…``).
            timeout: As for the constructor; default 2.0.
            clock: As for the constructor; default None.
        """
        engine = create_engine(url, **engine_options)
        if engine.dialect.driver == "pymysql":
            # Added to the flags SQLAlchemy and ``connect_args`` set (FOUND_ROWS among
            # them, which the run_once window claims count on), not in their place.
            event.listen(engine, "do_connect", several_statements)
        backend = cls(engine, timeout=timeout, clock=clock)
        backend._owns_engine = True
        return backend

    def _execute(
        self, conn: Connection, statement: TextClause, params: dict[str, Any], seconds: float
    ) -> Any:
        with read_timeout(conn, seconds):
            return conn.execute(statement, params)

    def _direct(
        self, conn: Connection, driver: Any, sql: str, params: dict[str, Any], seconds: float
    ) -> Reply:
        """Run ``sql`` (its statements one after the other, in one query) on ``driver``'s
        own cursor, as ``MySQLLockBackend._direct``; the last statement's reply."""
        with read_timeout(conn, seconds):
            cursor = driver.cursor()
            try:
                cursor.execute(sql, params)
                while cursor.nextset():
                    pass
            except self._dialect.loaded_dbapi.Error as exc:
                error, lost = self._wrapped(exc, sql, params, cursor)
                if lost:
                    conn.invalidate()
                raise error from exc
            done = Reply(int(cursor.rowcount or 0), int(cursor.lastrowid or 0))
            cursor.close()
            return done

    def _run(self, conn: Connection, driver: Any, steps: Generator[Step, Reply, T]) -> T:
        """Run ``steps`` (a flow from ``common``) on ``conn`` (``driver``: its driver's
        connection if it takes several statements in one query, else None)."""
        step = next(steps)
        while True:
            try:
                seconds = step.extra + self.timeout
                if step.paired:
                    done = self._direct(conn, driver, step.paired, step.params, seconds)
                else:
                    assert step.statement is not None
                    done = reply(self._execute(conn, step.statement, step.params, seconds))
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

    def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """As ``MySQLLockBackend.acquire``, blocking; the server does the waiting."""
        ttl_ms = check_ttl(ttl)
        wait = check_timeout(timeout)
        name = lock_name(resource, self.database)
        sent = self.clock()
        for retry in (True, False):
            conn, session, driver = self._checkout()
            try:
                grant = common.grant(name, wait, ttl_ms, paired=driver is not None)
                fence = self._run(conn, driver, grant)
                if fence and common.waited(sent, self.clock(), ttl_ms):
                    # We waited: restart the server's TTL timer from a moment we know.
                    sent = self.clock()
                    self._execute(conn, TOUCH, {"ttl": seconds(ttl_ms)}, self.timeout)
            except common.StaleSession as exc:
                self._abandon(conn, session)
                if retry:
                    continue
                raise self._unavailable(exc.__cause__ or exc) from exc
            except sqlalchemy.exc.DBAPIError as exc:
                if common.server_answered(exc):
                    # The statement is over, perhaps granted: end the session.
                    discard(conn)
                    if common.errno(exc) in NOT_GRANTED:
                        raise self._not_acquired(resource, timeout) from exc
                else:
                    # Timed out or cut off mid-statement: the server may still be
                    # waiting, or have granted the lock meanwhile.
                    self._abandon(conn, session)
                raise self._unavailable(exc) from exc
            except BaseException:
                self._abandon(conn, session)
                raise
            break
        if not fence:
            self._give_back(conn)
            raise self._not_acquired(resource, timeout)
        token = new_token()
        self._held[token] = _Held(conn, name, driver)
        return Lease(resource, token, fence, sent + ttl_ms / 1000, ttl_ms / 1000)

    def inspect(self, resource: str) -> LockState:
        """As ``MySQLLockBackend.inspect``, blocking.

        Args:
            resource: The lock's name.
        """
        params = {"name": lock_name(resource, self.database)}
        try:
            with self.engine.connect() as conn:
                try:
                    found = self._execute(conn, common.INSPECT, params, self.timeout)
                except sqlalchemy.exc.DBAPIError as exc:
                    if common.errno(exc) != common.NO_SUCH_TABLE:
                        raise
                    conn.rollback()
                    found = self._execute(conn, common.INSPECT_UNFENCED, params, self.timeout)
                return common.lock_state(resource, found.one())
        except UNAVAILABLE as exc:
            raise self._unavailable(exc) from exc

    def _checkout(self) -> tuple[Connection, int, Any]:
        """A pooled connection, its session id (``KILL CONNECTION`` needs it) and, if it
        takes several statements in one query, its driver's connection (else None)."""
        try:
            conn = self.engine.connect()
        except UNAVAILABLE as exc:
            raise self._unavailable(exc) from exc
        try:
            driver = conn.connection.driver_connection
            several = common.takes_several(driver)
            return conn, self._session_id(conn, driver), driver if several else None
        except BaseException as exc:
            discard(conn)
            if isinstance(exc, UNAVAILABLE):
                raise self._unavailable(exc) from exc
            raise

    def _session_id(self, conn: Connection, driver: Any) -> int:
        """pymysql has it from the handshake; another driver is asked once."""
        thread_id = getattr(driver, "thread_id", None)
        if callable(thread_id):
            return int(thread_id())
        return int(self._execute(conn, SESSION_ID, {}, self.timeout).scalar_one())

    def _abandon(self, conn: Connection, session: int) -> None:
        """End a session whose lock statement we stopped reading, leaving nothing held."""
        with contextlib.suppress(Exception), self.engine.connect() as killer:
            # A closed socket does not end a GET_LOCK wait: the server must be told.
            self._execute(killer, common.kill(session), {}, self.timeout)
            # KILL returns before the session ends, which holds its lock till then, and
            # nothing tells when it ends: ask (within ``timeout``, as the async backend),
            # so that an acquire that failed has left nothing behind once it raises.
            alive, give_up = {"session": session}, time.monotonic() + self.timeout
            while self._execute(killer, common.SESSION_ALIVE, alive, self.timeout).scalar_one():
                if time.monotonic() >= give_up:
                    break
                time.sleep(0.001)
        discard(conn)

    def _give_back(self, conn: Connection) -> None:
        """Restore the settings of a session that holds no lock and return it to the pool."""
        try:
            self._execute(conn, GIVE_BACK, {}, self.timeout)
        except UNAVAILABLE:
            discard(conn)
        except BaseException:
            discard(conn)
            raise
        else:
            conn.close()

    def extend(self, lease: Lease, ttl: float) -> Lease:
        """As ``MySQLLockBackend.extend``, blocking."""
        ttl_ms = check_ttl(ttl)
        held = self._held.get(lease.token)
        if held is None:
            raise self._not_owned(lease, "extend")
        with held.busy:
            if self._held.get(lease.token) is not held:
                raise self._not_owned(lease, "extend")
            sent = self.clock()
            try:
                self._execute(held.conn, TOUCH, {"ttl": seconds(ttl_ms)}, self._bound(lease, sent))
            except BaseException as exc:
                # A session that failed a statement cannot be trusted to hold anything:
                # end it, so the lock is freed for certain.
                self._held.pop(lease.token, None)
                discard(held.conn)
                if isinstance(exc, UNAVAILABLE):
                    why = f" ({type(exc).__name__}: its session ended or did not answer)"
                    raise self._not_owned(lease, "extend", why) from exc
                raise
        return lease.renewed(ttl_ms, sent)

    def release(self, lease: Lease) -> None:
        """As ``MySQLLockBackend.release``, blocking; ``LockNotOwned`` if it had lapsed."""
        held = self._held.pop(lease.token, None)
        if held is None:
            raise self._not_owned(lease, "release")
        with held.busy:
            try:
                params = {"name": held.name}
                if held.driver is not None:  # no result needed: skip SQLAlchemy's handling
                    self._direct(held.conn, held.driver, RELEASE_DIRECT, params, self.timeout)
                else:
                    self._execute(held.conn, RELEASE, params, self.timeout)
            except BaseException as exc:
                discard(held.conn)
                if not isinstance(exc, UNAVAILABLE):
                    raise
                if not common.server_answered(exc) and common.timed_out(exc):
                    # Closed from our side: the server frees the lock when it notices.
                    raise self._unavailable(exc) from exc
                raise self._not_owned(lease, "release", " (its session had ended)") from exc
            held.conn.close()

    def close(self) -> None:
        """Release every lease still held (their sessions end); dispose of the engine if
        ``from_url`` made it (else it stays yours)."""
        held, self._held = list(self._held.values()), {}
        for h in held:
            discard(h.conn)
        if self._owns_engine:
            self.engine.dispose()
