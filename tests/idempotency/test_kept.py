"""``RecordStore.from_url`` keeps its asyncpg connections between statements: one checkout
for many statements, fair to callers waiting on the pool, a connection the server closed
replaced, all given back by ``aclose`` or by garbage collection, and a forked child never
using its parent's."""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool, QueuePool
from sqlalchemy.util import greenlet_spawn

from headway import RecordStore
from headway.idempotency import kept
from headway.idempotency.executors import AsyncpgExecutor
from headway.idempotency.table import metadata, records

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

APPLICATION = "headway-kept-test"


@pytest.fixture
async def url(postgres_url: str) -> str:
    """The test database, with an empty records table."""
    engine = create_async_engine(postgres_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(records.delete())
    await engine.dispose()
    return postgres_url


def store_on(url: str, **engine_options: Any) -> RecordStore:
    settings = {"server_settings": {"application_name": APPLICATION}}
    return RecordStore.from_url(
        url, ttl=60, engine_options={"connect_args": settings, **engine_options}
    )


def checkouts(store: RecordStore) -> list[Any]:
    """The driver connection of every checkout from the store's pool, from now on."""
    seen: list[Any] = []
    pool = store.engine.sync_engine.pool
    sa.event.listen(
        pool, "checkout", lambda dbapi, record, proxy: seen.append(proxy.driver_connection)
    )
    return seen


def pool_of(store: RecordStore) -> QueuePool:
    assert isinstance(store.engine.pool, QueuePool)
    return store.engine.pool


async def claim(store: RecordStore, key: str) -> None:
    await store.claim("s", key, "f" * 64, fence=None, lease_token="t", lease_ttl=30)


async def test_statements_in_a_row_check_out_one_connection_aclose_gives_it_back(
    url: str,
) -> None:
    store = store_on(url)
    seen = checkouts(store)
    for i in range(5):
        assert await store.get("s", f"k{i}") is None
        await claim(store, f"k{i}")
    assert len(seen) == 1
    assert pool_of(store).checkedout() == 1
    await store.aclose()
    assert pool_of(store).checkedout() == 0


async def test_connections_beyond_what_it_keeps_go_back_to_callers_waiting(url: str) -> None:
    store = RecordStore.from_url(url, ttl=60, timeout=3, engine_options={"pool_size": 3})
    assert isinstance(store.executor, AsyncpgExecutor)
    assert store.executor.kept.keep == 1  # two left for everything else
    try:
        # Twelve claims on three connections, and a forget through SQLAlchemy among them:
        # each waits for a connection another gives back, none for the store's timeout.
        await asyncio.gather(
            *(claim(store, f"k{i}") for i in range(12)), store.forget("s", "k0", force=True)
        )
        assert pool_of(store).checkedout() == 1
    finally:
        await store.aclose()


async def test_a_kept_connection_the_server_closed_is_replaced(url: str) -> None:
    store = store_on(url)
    seen = checkouts(store)
    try:
        assert await store.get("s", "k") is None  # its connection is kept
        closed = asyncio.Event()
        seen[0].add_termination_listener(lambda _: closed.set())
        assert await terminate(url) == 1
        async with asyncio.timeout(10):
            await closed.wait()  # asyncpg saw the server close the socket
        assert await store.get("s", "k") is None  # on a new connection, at no round trip lost
        assert len(seen) == 2
    finally:
        await store.aclose()


async def test_a_store_never_closed_gives_its_connections_back_when_collected(
    url: str,
) -> None:
    store = store_on(url)
    engine, pool = store.engine, pool_of(store)
    assert await store.get("s", "k") is None
    assert pool.checkedout() == 1
    del store
    gc.collect()  # SQLAlchemy would warn here of a connection collected while checked out
    assert pool.checkedout() == 0
    await engine.dispose()


async def test_a_forked_child_never_uses_nor_closes_its_parents_connection(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_on(url)
    seen = checkouts(store)
    assert await store.get("s", "k") is None
    parent = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent + 1)  # as seen in a forked child
    try:
        assert await store.get("s", "k") is None
        assert len(seen) == 2  # its own connection
        assert not seen[0].is_closed()  # the parent's: still open, never touched
    finally:
        monkeypatch.undo()
        assert len(kept._PARENTS) == 1
        await greenlet_spawn(kept._PARENTS.pop().close)
        await store.aclose()


def test_a_pool_that_checks_or_does_not_pool_keeps_nothing() -> None:
    url = "postgresql+asyncpg://app@db.invalid/app"
    cases: list[tuple[dict[str, Any], int]] = [
        ({}, 18),
        ({"pool_size": 5}, 3),
        ({"pool_pre_ping": True}, 0),
        ({"pool_recycle": 3600}, 0),
        ({"poolclass": NullPool}, 0),
    ]
    for options, keep in cases:
        executor = RecordStore.from_url(url, engine_options=options).executor
        assert isinstance(executor, AsyncpgExecutor)
        assert executor.kept.keep == keep, options
    engine = create_async_engine(url)  # an engine the caller passes may be shared: kept none
    executor = RecordStore(engine).executor
    assert isinstance(executor, AsyncpgExecutor)
    assert executor.kept.keep == 0


async def terminate(url: str) -> int:
    """Terminate this test's server connections from one of its own; how many."""
    admin = create_async_engine(url, poolclass=NullPool)
    query = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :a"
    try:
        async with admin.connect() as conn:
            return len((await conn.execute(sa.text(query), {"a": APPLICATION})).all())
    finally:
        await admin.dispose()
