"""A database that was never migrated: keyed requests are answered 503 problem+json, one
log line says to run ``headway migrate``, and once the table exists requests run."""

import logging
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from headway import DatabaseNotMigrated, RecordStore
from headway.idempotency.table import metadata
from tests.idempotency.apps import Bank
from tests.idempotency.test_events import client_for, post

pytestmark = pytest.mark.anyio


@pytest.fixture
async def unmigrated(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on a database without the records table."""
    engine = create_async_engine(database_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_an_unmigrated_database_answers_503_and_says_migrate_once(
    unmigrated: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    bank = Bank()
    async with client_for(bank, RecordStore(unmigrated, ttl=60)) as client:
        with caplog.at_level(logging.INFO, logger="headway"):
            answers = [await post(client, "/payments", f"k{i}") for i in range(3)]
        for answer in answers:
            assert answer.status_code == 503
            assert answer.headers["content-type"] == "application/problem+json"
            assert answer.headers["retry-after"] == "1"  # the middleware's default
        assert bank.charges == []
        lines = [record.getMessage() for record in caplog.records]
        assert len(lines) == 1, lines  # not one per request
        assert "headway migrate" in lines[0]
        assert caplog.records[0].levelno == logging.ERROR

        async with unmigrated.begin() as conn:  # what `headway migrate` creates
            await conn.run_sync(metadata.create_all)
        assert (await post(client, "/payments", "k0")).status_code == 201
    assert len(bank.charges) == 1


async def test_the_store_raises_database_not_migrated(unmigrated: AsyncEngine) -> None:
    store = RecordStore(unmigrated, ttl=60)
    with pytest.raises(DatabaseNotMigrated, match="run `headway migrate "):
        await store.claim("s", "k", "f" * 64, fence=None, lease_token="t", lease_ttl=30)
    with pytest.raises(DatabaseNotMigrated) as raised:
        await store.purge()
    assert raised.value.backend == "database"  # a BackendUnavailable: callers fail closed
