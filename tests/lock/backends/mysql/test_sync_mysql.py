"""SyncMySQLLockBackend (pymysql) against a real MariaDB/MySQL server: what threads add to
the shared contract (tests/lock/test_sync_lock.py runs that over it)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import QueuePool

from headway import BackendUnavailable, LockNotAcquired, SyncLock, SyncMySQLLockBackend
from headway.lock.backends.mysql import FENCE_TABLE, lock_name

pytestmark = [pytest.mark.mysql]


def sync_url(mysql_url: str) -> str:
    """The test server's URL with the sync driver."""
    return sa.make_url(mysql_url).set(drivername="mysql+pymysql").render_as_string(False)


@pytest.fixture
def sync_engine(mysql_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(sync_url(mysql_url), pool_size=16, max_overflow=8)
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
