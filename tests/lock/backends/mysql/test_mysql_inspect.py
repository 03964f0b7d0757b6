"""MySQL's ``inspect`` before any grant made the fence table, and its count of waiters."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from headway import Lock, LockState
from headway.lock.backends.mysql import MySQLLockBackend

pytestmark = pytest.mark.anyio


async def test_no_fence_table_yet_reads_as_free(mysql_url: str, resource: str) -> None:
    # A database where no lock was ever granted has no fence table (here: none can be).
    url = sa.make_url(mysql_url).set(database="mysql")
    engine = create_async_engine(url)
    try:
        assert await MySQLLockBackend(engine).inspect(resource) == LockState(resource)
    finally:
        await engine.dispose()


async def test_waiters_in_get_lock_are_counted(backend: MySQLLockBackend, resource: str) -> None:
    lock = Lock(backend, resource, ttl=10, timeout=10)
    lease = await lock.acquire()
    other = Lock(backend, resource + "-other", ttl=10)  # a name that is not this one
    apart = await other.acquire()
    waiters = [asyncio.create_task(lock.acquire()) for _ in range(2)]
    while (state := await lock.inspect()).waiting < 2:  # server state: polled
        assert not any(w.done() for w in waiters)
        await asyncio.sleep(0.01)
    assert [h.fence for h in state.holders] == [lease.fence]
    assert (await other.inspect()).waiting == 0
    await lock.release(lease)
    # Whichever reached the server first is granted first: release each as it comes.
    for granted in asyncio.as_completed(waiters):
        await lock.release(await granted)
    await other.release(apart)
