"""The store's executors: PostgreSQL+asyncpg runs the prebuilt statements on the driver,
with the same records as SQLAlchemy's path, and a driver connection lost is a 503 cause
(``BackendUnavailable``), never a driver error, nor a broken connection reused."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from headway import BackendUnavailable, RecordStore
from headway.idempotency.executors import AsyncpgExecutor, SqlAlchemyExecutor
from headway.idempotency.record import Claim, StoredResponse
from headway.idempotency.table import db_now, metadata, records

from .statements import Statements

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

APPLICATION = "headway-executor-test"
RESPONSE = StoredResponse(201, (("content-type", "application/json"), ("x", "1")), b'{"id": 1}')


@pytest.fixture
async def engine(postgres_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(
        postgres_url, connect_args={"server_settings": {"application_name": APPLICATION}}
    )
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(records.delete())
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_sqlite_keeps_sqlalchemy(tmp_path: Any) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'x.sqlite3'}")
    assert isinstance(RecordStore(engine).executor, SqlAlchemyExecutor)
    await engine.dispose()


async def test_postgresql_store_runs_its_statements_on_the_driver(engine: AsyncEngine) -> None:
    store = RecordStore(engine, ttl=60)
    assert isinstance(store.executor, AsyncpgExecutor)
    sent = Statements(engine)
    assert await store.get("caller", "k") is None
    claim = await store.claim("caller", "k", "f", fence=7, lease_token="t", lease_ttl=30)
    assert claim.fence == 7
    assert await store.renew("caller", "k", 7, 30)
    assert await store.complete("caller", "k", 7, RESPONSE)
    await sent.settled()
    assert sent.sent == ["SELECT", "INSERT", "UPDATE", "UPDATE"]
    assert sent.on_driver == 4  # none through SQLAlchemy's execution
    assert all(sent.autocommitted)
    assert sent.transactions == 0


async def scenario(store: RecordStore, caller: str) -> list[Any]:
    """Every answer a first execution, a duplicate, a takeover and a replay give."""

    async def claim(key: str, fingerprint: str, fence: int | None) -> Claim:
        return await store.claim(
            caller, key, fingerprint, fence=fence, lease_token="t", lease_ttl=30
        )

    def plain(claim: Claim) -> Any:  # lease_left counts down: whether there was one
        record = None if claim.record is None else dataclasses.replace(claim.record, caller="")
        left = None if claim.lease_left is None else claim.lease_left > 0
        return claim.outcome, record, claim.fence, left

    answers: list[Any] = [await store.get(caller, "a"), plain(await claim("a", "f", 5))]
    answers += [plain(await claim("a", "other", 6)), plain(await claim("a", "f", 6))]
    answers += [await store.renew(caller, "a", 5, 30), await store.renew(caller, "a", 4, 30)]
    async with store.engine.begin() as conn:  # a's lease ran out: a newer holder takes over
        await conn.execute(records.update().values(lease_expires_at=db_now(-1)))
    answers += [plain(await claim("a", "f", 9)), await store.complete(caller, "a", 5, RESPONSE)]
    answers += [await store.complete(caller, "a", 9, RESPONSE), plain(await claim("a", "f", 10))]
    record = await store.get(caller, "a")
    answers.append(None if record is None else dataclasses.replace(record, caller=""))
    unlocked = await claim("b", "f", None)  # the store picks the fence
    assert unlocked.fence is not None
    answers += [await store.release(caller, "b", unlocked.fence), await store.get(caller, "b")]
    answers += [await store.release(caller, "b", unlocked.fence)]
    return answers


async def test_both_executors_give_the_same_answers(engine: AsyncEngine) -> None:
    driver = RecordStore(engine, ttl=60)
    through_sqlalchemy = RecordStore(engine, ttl=60)
    through_sqlalchemy.executor = SqlAlchemyExecutor(engine)
    sent = Statements(engine)
    expected = await scenario(through_sqlalchemy, "sqlalchemy")
    assert (await sent.settled()).on_driver == 0
    async with engine.begin() as conn:
        await conn.execute(records.delete())
    assert await scenario(driver, "driver") == expected
    assert (await sent.settled()).on_driver > 0
    assert expected[-4].response == RESPONSE  # the replayed record, headers and body


async def terminate(url: str, *, waiting: bool = False) -> int:
    """Terminate the test engine's backends (only those waiting for a lock, if
    ``waiting``), from a connection of its own; how many."""
    admin = create_async_engine(url, poolclass=NullPool)
    query = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :a"
    if waiting:
        query += " AND wait_event_type = 'Lock'"
    try:
        async with admin.connect() as conn:
            return len((await conn.execute(sa.text(query), {"a": APPLICATION})).all())
    finally:
        await admin.dispose()


async def test_a_connection_lost_mid_statement_is_unavailable_then_replaced(
    engine: AsyncEngine, postgres_url: str
) -> None:
    store = RecordStore(engine, ttl=60, timeout=10)
    await store.claim("caller", "k", "f", fence=5, lease_token="t", lease_ttl=30)
    async with engine.connect() as locker:  # the completion queues behind a row lock
        await locker.execute(sa.select(records).with_for_update())
        completing = asyncio.ensure_future(store.complete("caller", "k", 5, RESPONSE))
        deadline = time.monotonic() + 10
        while not await terminate(postgres_url, waiting=True):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)  # until the completion waits for the lock
        with pytest.raises(BackendUnavailable, match="connection lost"):
            await completing
        await locker.rollback()
    # The broken connection went out of the pool: the retry completes on a fresh one.
    assert await store.complete("caller", "k", 5, RESPONSE)


async def test_a_pooled_connection_closed_by_the_server_is_replaced(
    engine: AsyncEngine, postgres_url: str
) -> None:
    store = RecordStore(engine, ttl=60)
    assert await store.get("caller", "k") is None  # one connection now idles in the pool
    async with engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    assert await terminate(postgres_url) == 1
    deadline = time.monotonic() + 10
    while not driver.is_closed():  # asyncpg sees the server close the socket
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    # No round trip is spent finding out: the closed connection is swapped at checkout.
    assert await store.get("caller", "k") is None


async def test_a_statement_stuck_behind_a_lock_is_cut_by_the_store_timeout(
    engine: AsyncEngine,
) -> None:
    store = RecordStore(engine, ttl=60, timeout=0.3)
    await store.claim("caller", "k", "f", fence=5, lease_token="t", lease_ttl=30)
    async with engine.connect() as locker:  # the completion waits behind a row lock...
        await locker.execute(sa.select(records).with_for_update())
        async with asyncio.timeout(10):  # (a safety net: the test fails rather than hangs)
            with pytest.raises(BackendUnavailable):  # ...until the store's timeout cuts it
                await store.complete("caller", "k", 5, RESPONSE)
            # At once, while the cut statement may still be winding down on its connection.
            record = await store.get("caller", "k")
        await locker.rollback()
    assert record is not None
    assert await store.complete("caller", "k", 5, RESPONSE)


async def test_an_engine_translating_schemas_keeps_sqlalchemy(engine: AsyncEngine) -> None:
    translated = engine.execution_options(schema_translate_map={None: "public"})
    assert isinstance(RecordStore(translated).executor, SqlAlchemyExecutor)


async def test_driver_false_keeps_every_statement_where_sqlalchemy_events_see_it(
    engine: AsyncEngine,
) -> None:
    store = RecordStore(engine, ttl=60, driver=False)
    assert isinstance(store.executor, SqlAlchemyExecutor)
    sent = Statements(engine)
    assert await store.get("caller", "k2") is None
    await store.claim("caller", "k2", "f", fence=7, lease_token="t", lease_ttl=30)
    await sent.settled()
    assert sent.on_driver == 0
    assert sent.sent == ["SELECT", "INSERT"]
