"""What the async and the sync MySQL lock backends share: the statements, the lock
names, the grant's steps (with the fence table's first use and a full table), the
error mapping and the messages. Each backend only runs statements on its own kind of
connection (see ``backend`` for the design).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import sqlalchemy.exc
from sqlalchemy import TextClause, text

from headway._clock import Clock, MonotonicClock
from headway.lock.backends.sql_session import LeaseErrors
from headway.lock.introspection import Holder, LockState
from headway.lock.lease import check_timeout

__all__ = ["FENCE_TABLE", "lock_name"]

#: The counter table of fencing tokens, in the engine's database.
FENCE_TABLE = "headway_lock_fences"

_COLUMNS = """(
    name CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    fence BIGINT UNSIGNED NOT NULL
)"""
# In memory: a grant's write pays no redo-log flush (the fence is clock-floored, so a
# lost row costs nothing). A server that refuses MEMORY tables gets an InnoDB one.
CREATE = text(f"CREATE TABLE IF NOT EXISTS headway_lock_fences {_COLUMNS} ENGINE = MEMORY")
CREATE_DURABLE = text(f"CREATE TABLE IF NOT EXISTS headway_lock_fences {_COLUMNS} ENGINE = InnoDB")
# The session's setup and the lock wait in one statement. Every expression of a SET
# is evaluated before any variable is assigned, so the saved values are the session's
# own; ``wait_timeout`` (the TTL) counts idle time between statements, so it does not
# cut the wait short.
GRANT = text("""
SET @headway_granted = GET_LOCK(:name, :wait),
    @headway_autocommit = @@session.autocommit,
    @headway_last_insert_id = LAST_INSERT_ID(),
    @headway_time_zone = @@session.time_zone,
    @headway_wait_timeout = @@session.wait_timeout,
    SESSION autocommit = 1, SESSION time_zone = '+00:00', SESSION wait_timeout = :ttl
""")
_NOW_US = "CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS UNSIGNED)"
# Raised after the grant, in its own statement: the table (MEMORY, locked whole by a
# write) is held only for the write, never through a lock wait. One row of DUAL
# passes the WHERE only if the grant's statement was granted; only then are the
# SELECT list and the UPDATE evaluated (SYSDATE is read then, unlike NOW).
# rowcount: 0 not granted, 1 first fence of this name, 2 raised; lastrowid: the fence.
# Built from constant fragments only.
FENCE = text(f"""
INSERT INTO headway_lock_fences (name, fence)
SELECT :name, LAST_INSERT_ID({_NOW_US} + 1)
FROM DUAL WHERE @headway_granted = 1
ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(GREATEST(fence + 1, {_NOW_US} + 1))
""")  # noqa: S608


def _driver_sql(clause: TextClause, names: tuple[str, ...]) -> str:
    """``clause``'s SQL with its bind parameters in the drivers' own style, ``%(name)s``."""
    sql = clause.text
    for name in names:
        sql = sql.replace(f":{name}", f"%({name})s")
    return sql


# The grant and the fence in one round trip: two statements in one query, where the
# driver's connection allows several (aiomysql's always do). The server runs the second
# only once the first has ended, so the fence table is still never opened during a wait.
GRANT_AND_FENCE = f"{_driver_sql(GRANT, ('name', 'wait', 'ttl'))};{_driver_sql(FENCE, ('name',))}"
# A row whose fence the clock has reached carries nothing: the next grant's clock
# floor gives at least as much. Deleting those frees a full MEMORY table.
PRUNE = text(f"DELETE FROM headway_lock_fences WHERE fence <= {_NOW_US}")  # noqa: S608
# Any statement restarts the server's idle timer; this one also sets its new length.
TOUCH = text("SET SESSION wait_timeout = :ttl")
_RESTORE = """
    @headway_last_insert_id = LAST_INSERT_ID(@headway_last_insert_id),
    SESSION autocommit = @headway_autocommit,
    SESSION time_zone = @headway_time_zone,
    SESSION wait_timeout = @headway_wait_timeout
"""
GIVE_BACK = text(f"SET {_RESTORE}")
# A live session holds its lock (only its end or its own RELEASE_LOCK frees it), so
# the statement succeeding is the answer; its result is not needed.
RELEASE = text(f"SET @headway_released = RELEASE_LOCK(:name), {_RESTORE}")
RELEASE_DIRECT = _driver_sql(RELEASE, ("name",))  # on the driver's own cursor
SESSION_ID = text("SELECT CONNECTION_ID()")
# ``inspect``: the holder's session (NULL: free), its fence (the row its grant wrote), and
# the sessions waiting in GET_LOCK for the name, found by their statement's text in the
# process list (performance_schema and metadata_lock_info are off by default on MariaDB).
# A user without the PROCESS privilege sees its own sessions only.
_WAITING = """(SELECT COUNT(*) FROM information_schema.PROCESSLIST
     WHERE STATE = 'User lock' AND INFO LIKE CONCAT('%GET_LOCK(''', :name, '''%'))"""
INSPECT = text(f"""
SELECT IS_USED_LOCK(:name), (SELECT fence FROM headway_lock_fences WHERE name = :name),
    {_WAITING}
""")  # noqa: S608
#: The same where the fence table was never made (no lock granted in this database yet).
INSPECT_UNFENCED = text(f"SELECT IS_USED_LOCK(:name), 0, {_WAITING}")


def kill(session: int) -> TextClause:
    """End session ``session`` from another one: a lock wait there stops, a statement not
    yet read is never run, whatever it holds is freed (``KILL QUERY`` would miss a
    statement still on its way, and the socket's close does not end a wait)."""
    return text(f"KILL CONNECTION {int(session)}")


#: Whether session ``:session`` still exists (``KILL`` ends it after it returns).
SESSION_ALIVE = text("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = :session")


#: Error numbers that end a lock wait without the lock: a deadlock among user-level
#: locks (MariaDB ER_LOCK_DEADLOCK, MySQL 8 ER_USER_LOCK_DEADLOCK), a statement time
#: limit (MariaDB max_statement_time, MySQL max_execution_time).
NOT_GRANTED = frozenset({1213, 3058, 1969, 3024})
NO_SUCH_TABLE = 1146
TABLE_FULL = 1114
#: Errors that mean "the server is not answering (or the session is gone)".
UNAVAILABLE = (sqlalchemy.exc.DBAPIError, sqlalchemy.exc.TimeoutError, OSError, TimeoutError)


def lock_name(resource: str, database: str = "") -> str:
    """The ``GET_LOCK`` name of ``resource`` in ``database``: 64 characters, lower case."""
    digest = hashlib.sha256(f"{database}\0{resource}".encode()).hexdigest()
    return f"headway:{digest[:56]}"


def seconds(ttl_ms: int) -> int:
    """``wait_timeout`` for a TTL: whole seconds (at least 1), rounded up, never below it."""
    return max(1, math.ceil(ttl_ms / 1000))


def errno(exc: BaseException) -> int | None:
    """The server's (or the client library's, from 2000) error number behind ``exc``."""
    args = getattr(getattr(exc, "orig", None), "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def server_answered(exc: BaseException) -> bool:
    """``exc`` is an error the server sent: the statement is over. Otherwise (a lost or
    timed-out connection, error numbers from 2000) it may still run on the server."""
    number = errno(exc)
    return isinstance(exc, sqlalchemy.exc.DBAPIError) and number is not None and number < 2000


@dataclass(frozen=True)
class Step:
    """One statement of a backend's flow: run ``statement`` with ``params``, allowing
    ``extra`` seconds beyond the backend's timeout, and send back a ``Reply``. A step
    with ``paired`` SQL (several statements, in the driver's parameter style) sends
    that instead, on the driver's connection, and replies with its last statement's."""

    statement: TextClause | None
    params: dict[str, Any]
    extra: float = 0.0
    paired: str = ""


@dataclass(frozen=True)
class Reply:
    rowcount: int
    lastrowid: int


def reply(result: Any) -> Reply:
    return Reply(int(result.rowcount or 0), int(result.lastrowid or 0))


class StaleSession(Exception):
    """The grant's first statement found its pooled session closed by the server (a
    restart, an idle timeout): it ran nothing there, and a fresh session may try."""


def timed_out(exc: BaseException) -> bool:
    """``exc`` is the driver's report of our own read timeout (the server may still be
    running the statement)."""
    orig = getattr(exc, "orig", None)
    return isinstance(getattr(orig, "__context__", None), TimeoutError)


def grant(name: str, wait: float, ttl_ms: int, paired: bool = False) -> Generator[Step, Reply, int]:
    """The steps of a grant on a fresh session: the fence if ``name`` was granted
    within ``wait`` s, else 0 (the session is set up either way: give it back).
    ``paired``: the session's connection takes several statements in one query, so the
    grant and the fence go in one round trip.

    The driver sends each step's reply back, or throws its ``DBAPIError`` in. An error
    that escapes leaves the session in doubt: the driver must end it (after a
    ``StaleSession``, it may try once more on a fresh one).
    """
    setup = {"name": name, "wait": wait, "ttl": seconds(ttl_ms)}
    fence = {"name": name}
    try:
        if paired:
            done = yield Step(None, setup, wait, paired=GRANT_AND_FENCE)
        else:
            yield Step(GRANT, setup, wait)
    except sqlalchemy.exc.DBAPIError as exc:
        if not (paired and errno(exc) in (NO_SUCH_TABLE, TABLE_FULL)):
            if exc.connection_invalidated and not timed_out(exc):
                raise StaleSession from exc
            raise
        done = yield from _fence_again(exc, fence)  # granted; the fence's write failed
    else:
        if not paired:
            done = yield from _fence(fence)
    return done.lastrowid if done.rowcount else 0


def _fence(params: dict[str, Any]) -> Generator[Step, Reply, Reply]:
    """The fence's write, after the grant's statement."""
    try:
        return (yield Step(FENCE, params))
    except sqlalchemy.exc.DBAPIError as exc:
        return (yield from _fence_again(exc, params))


def _fence_again(
    exc: sqlalchemy.exc.DBAPIError, params: dict[str, Any]
) -> Generator[Step, Reply, Reply]:
    """After the fence's write failed with ``exc``: make the table (its first use) or
    room in it (full), and write again; any other error escapes."""
    if errno(exc) == NO_SUCH_TABLE:
        try:
            yield Step(CREATE, {})
        except sqlalchemy.exc.DBAPIError:
            yield Step(CREATE_DURABLE, {})
    elif errno(exc) == TABLE_FULL:
        yield Step(PRUNE, {})
    else:
        raise exc
    return (yield Step(FENCE, params))


def lock_state(resource: str, row: Any) -> LockState:
    """The ``LockState`` an ``INSPECT`` row tells: no owner (the server keeps no token)
    and no time left (the TTL is the holder's session setting, which nobody else reads)."""
    session, fence, waiting = row
    holders = () if session is None else (Holder(int(fence or 0), None),)
    return LockState(resource, holders, int(waiting))


def waited(sent: float, now: float, ttl_ms: int) -> bool:
    """The grant took long enough that the server's TTL timer must restart from ``now``."""
    return now - sent > ttl_ms / 1000 / 10


#: The client capability of several statements in one query (``CLIENT_MULTI_STATEMENTS``).
MULTI_STATEMENTS = 1 << 16


def takes_several(driver: Any) -> bool:
    """Whether the driver's connection takes several statements in one query."""
    return bool(getattr(driver, "client_flag", 0) & MULTI_STATEMENTS)


class Common(LeaseErrors):
    """The parts of a MySQL lock backend that do not run statements."""

    name = "mysql"
    _server = "MySQL"

    def __init__(self, engine: Any, timeout: float, clock: Clock | None) -> None:
        if engine.dialect.name not in ("mysql", "mariadb"):
            raise ValueError(
                f"{type(self).__name__} needs a MySQL or MariaDB engine, not {engine.url!r}"
            )
        self.timeout = check_timeout(timeout)
        self.clock: Clock = clock or MonotonicClock()
        self.database: str = engine.url.database or ""
        self._dialect = engine.dialect

    def _wrapped(
        self, exc: Exception, sql: str, params: dict[str, Any], cursor: Any
    ) -> tuple[sqlalchemy.exc.StatementError, bool]:
        """The driver's ``exc`` on its own cursor, wrapped as SQLAlchemy wraps its own
        statements' errors (for the flows and the callers), and whether the connection
        is lost (the caller invalidates it)."""
        lost = self._dialect.is_disconnect(exc, None, cursor)
        error = sqlalchemy.exc.DBAPIError.instance(
            sql,
            params,
            exc,
            self._dialect.loaded_dbapi.Error,
            connection_invalidated=lost,
            dialect=self._dialect,
        )
        return error, lost
