"""SyncMySQLLockBackend (pymysql) against a real MariaDB/MySQL server: what threads add to
the shared contract (tests/lock/test_sync_lock.py runs that over it)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pymysql  # type: ignore[import-untyped]
import pytest
import sqlalchemy as sa
from sqlalchemy.pool import QueuePool

from headway import BackendUnavailable, LockNotAcquired, SyncLock, SyncMySQLLockBackend
from headway.lock.backends.mysql import FENCE_TABLE, lock_name
from headway.lock.backends.mysql.common import MULTI_STATEMENTS

pytestmark = [pytest.mark.mysql]


def sync_url(mysql_url: str) -> str:
    """The test server's URL with the sync driver."""
    return sa.make_url(mysql_url).set(drivername="mysql+pymysql").render_as_string(False)


# A connection that takes several statements in one query gets the grant and its fence
# in one (``from_url`` makes such engines); others, two statements one after the other.
PATHS = {"one query": {"client_flag": MULTI_STATEMENTS}, "two statements": {}}


@pytest.fixture(params=list(PATHS))
def sync_engine(mysql_url: str, request: pytest.FixtureRequest) -> Iterator[sa.Engine]:
    options = {"connect_args": PATHS[request.param]}
    eng = sa.create_engine(sync_url(mysql_url), pool_size=16, max_overflow=8, **options)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def sync_backend(sync_engine: sa.Engine) -> Iterator[SyncMySQLLockBackend]:
    b = SyncMySQLLockBackend(sync_engine)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def resource() -> str:
    return f"test-{uuid.uuid4().hex}"


def _scalar(engine: sa.Engine, query: str, **params: object) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text(query), params).scalar()


def holder(engine: sa.Engine, name: str) -> object:
    return _scalar(engine, "SELECT IS_USED_LOCK(:n)", n=name)


def waiters(engine: sa.Engine, name: str) -> int:
    query = (
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
        " WHERE STATE = 'User lock' AND INFO LIKE :p"
    )
    return int(_scalar(engine, query, p=f"%{name}%"))


def checked_out(engine: sa.Engine) -> int:
    pool = engine.pool
    assert isinstance(pool, QueuePool), pool
    return pool.checkedout()


def eventually(check: Callable[[], bool], within: float = 5.0) -> None:
    end = time.monotonic() + within
    while not check():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.02)


def test_acquire_release_and_fences(
    sync_backend: SyncMySQLLockBackend, sync_engine: sa.Engine, resource: str
) -> None:
    name = lock_name(resource, sync_backend.database)
    lease = sync_backend.acquire(resource, ttl=5, timeout=0)
    assert abs(lease.fence / 1e6 - time.time()) < 60
    assert holder(sync_engine, name) is not None
    sync_backend.release(lease)
    assert holder(sync_engine, name) is None
    again = sync_backend.acquire(resource, ttl=5, timeout=0)
    assert again.fence > lease.fence
    sync_backend.release(again)
    assert checked_out(sync_engine) == 0


def test_a_thread_whose_wait_times_out_leaves_nothing(
    sync_backend: SyncMySQLLockBackend, sync_engine: sa.Engine, resource: str
) -> None:
    name = lock_name(resource, sync_backend.database)
    lease = sync_backend.acquire(resource, ttl=10, timeout=0)
    caught: list[BaseException] = []

    def wait() -> None:
        try:
            sync_backend.acquire(resource, ttl=10, timeout=0.3)
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=wait)
    started = time.monotonic()
    thread.start()
    eventually(lambda: waiters(sync_engine, name) == 1)
    thread.join(5)
    assert 0.3 <= time.monotonic() - started < 3
    assert [type(e) for e in caught] == [LockNotAcquired]
    # No waiter left in the server, the waiter's session back in the pool, the holder intact.
    assert waiters(sync_engine, name) == 0
    assert checked_out(sync_engine) == 1
    assert holder(sync_engine, name) is not None
    sync_backend.release(lease)
    assert holder(sync_engine, name) is None
    assert checked_out(sync_engine) == 0


def test_a_waiting_thread_is_woken_by_the_release(
    sync_backend: SyncMySQLLockBackend, sync_engine: sa.Engine, resource: str
) -> None:
    lock = SyncLock(sync_backend, resource, ttl=10)
    first = lock.acquire(timeout=0)
    got = []
    thread = threading.Thread(target=lambda: got.append(lock.acquire(timeout=10)))
    thread.start()
    eventually(lambda: waiters(sync_engine, lock_name(resource, sync_backend.database)) == 1)
    released = time.monotonic()
    lock.release(first)
    thread.join(5)
    assert time.monotonic() - released < 1
    assert len(got) == 1
    assert got[0].fence > first.fence
    lock.release(got[0])


def test_a_stalled_round_trip_is_unavailable_and_frees_the_lock(
    sync_engine: sa.Engine, resource: str
) -> None:
    # Granted, then the fence's write waits (the table locked by another session) past
    # the read timeout: the session that holds the lock is ended, from another one.
    backend = SyncMySQLLockBackend(sync_engine, timeout=0.5)
    name = lock_name(resource, backend.database)
    backend.release(backend.acquire(resource, ttl=5, timeout=0))
    with sync_engine.connect() as locker:
        locker.execute(sa.text(f"LOCK TABLES {FENCE_TABLE} WRITE"))
        try:
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                backend.acquire(resource, ttl=5, timeout=0)
            assert time.monotonic() - started < 3
            # Free by the time the error is raised: the killed session has ended.
            assert holder(sync_engine, name) is None
        finally:
            locker.execute(sa.text("UNLOCK TABLES"))
    backend.release(backend.acquire(resource, ttl=5, timeout=0))
    assert checked_out(sync_engine) == 0


def test_a_killed_session_is_not_owned_any_more(
    sync_backend: SyncMySQLLockBackend, sync_engine: sa.Engine, resource: str
) -> None:
    from headway import LockNotOwned

    lease = sync_backend.acquire(resource, ttl=10, timeout=0)
    session = holder(sync_engine, lock_name(resource, sync_backend.database))
    with sync_engine.connect() as conn:
        conn.execute(sa.text(f"KILL {session}"))
    with pytest.raises(LockNotOwned):
        sync_backend.extend(lease, 10)
    with pytest.raises(LockNotOwned):
        sync_backend.release(lease)
    sync_backend.release(sync_backend.acquire(resource, ttl=5, timeout=0))


def test_rejects_other_databases() -> None:
    with pytest.raises(ValueError, match="MySQL or MariaDB"):
        SyncMySQLLockBackend(sa.create_engine("sqlite://"))


def sent_commands(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queries pymysql sends from now on (until ``monkeypatch.undo()``)."""
    sent: list[str] = []
    send = pymysql.connections.Connection._execute_command

    def counted(self: pymysql.connections.Connection, command: int, sql: Any) -> Any:
        sent.append(sql if isinstance(sql, str) else bytes(sql).decode(errors="replace"))
        return send(self, command, sql)

    monkeypatch.setattr(pymysql.connections.Connection, "_execute_command", counted)
    return sent


def test_from_url_sends_the_grant_and_its_fence_in_one_query(
    mysql_url: str, resource: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = SyncMySQLLockBackend.from_url(sync_url(mysql_url), pool_size=2)
    try:
        backend.release(backend.acquire(resource, ttl=5, timeout=0))  # the table made
        sent = sent_commands(monkeypatch)
        backend.release(backend.acquire(resource, ttl=5, timeout=0))
        monkeypatch.undo()
    finally:
        backend.close()
    lock_statements = [sql for sql in sent if "RELEASE_LOCK" not in sql and "headway" in sql]
    [grant] = [sql for sql in lock_statements if "GET_LOCK" in sql or FENCE_TABLE in sql]
    assert "GET_LOCK" in grant
    assert f"INSERT INTO {FENCE_TABLE}" in grant
    assert [sql for sql in sent if "RELEASE_LOCK" in sql]  # and one release


def test_a_plain_engine_sends_the_fence_after_the_grant(
    mysql_url: str, resource: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = sa.create_engine(sync_url(mysql_url), pool_size=2)
    backend = SyncMySQLLockBackend(engine)
    try:
        backend.release(backend.acquire(resource, ttl=5, timeout=0))
        sent = sent_commands(monkeypatch)
        backend.release(backend.acquire(resource, ttl=5, timeout=0))
        monkeypatch.undo()
    finally:
        backend.close()
        engine.dispose()
    grant = [sql for sql in sent if "GET_LOCK" in sql or FENCE_TABLE in sql]
    assert len(grant) == 2, grant
    assert "GET_LOCK" in grant[0]
    assert FENCE_TABLE in grant[1]


def test_close_disposes_of_the_engine_from_url_made(mysql_url: str, resource: str) -> None:
    backend = SyncMySQLLockBackend.from_url(sync_url(mysql_url), pool_size=2)
    backend.release(backend.acquire(resource, ttl=5, timeout=0))
    with backend.engine.connect() as conn:  # the pooled session of that lease
        session = conn.execute(sa.text("SELECT CONNECTION_ID()")).scalar_one()
    backend.close()
    with sa.create_engine(sync_url(mysql_url), poolclass=sa.NullPool).connect() as conn:
        query = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = :id"
        eventually(lambda: conn.execute(sa.text(query), {"id": session}).scalar_one() == 0)


def test_from_url_adds_its_flag_to_the_drivers_own(mysql_url: str) -> None:
    # SQLAlchemy's flags stay (FOUND_ROWS, which run_once's window claims count on):
    # from_url's connections differ from a plain engine's by several statements only.
    def flags(engine: sa.Engine) -> int:
        with engine.connect() as conn:
            return int(conn.connection.driver_connection.client_flag)  # type: ignore[union-attr]

    plain = sa.create_engine(sync_url(mysql_url), poolclass=sa.NullPool)
    backend = SyncMySQLLockBackend.from_url(sync_url(mysql_url), pool_size=1)
    try:
        assert flags(backend.engine) == flags(plain) | MULTI_STATEMENTS
        assert flags(plain) & MULTI_STATEMENTS == 0
    finally:
        backend.close()
        plain.dispose()
