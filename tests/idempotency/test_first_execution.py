"""A first execution costs its commits: round trips counted on real PostgreSQL."""

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from headway import MemoryLockBackend, RecordStore
from headway.idempotency.table import metadata, records
from tests.idempotency.apps import Bank, make_app
from tests.idempotency.statements import Statements

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture
async def counted(postgres_url: str) -> AsyncIterator[tuple[RecordStore, Statements]]:
    engine = create_async_engine(postgres_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(records.delete())
    trips = Statements(engine)
    try:
        yield RecordStore(engine, ttl=60), trips
    finally:
        await engine.dispose()


async def test_first_execution_is_three_round_trips_and_replay_one(
    counted: tuple[RecordStore, Statements],
) -> None:
    store, trips = counted
    app = make_app(Bank(), store=store, lock_backend=MemoryLockBackend())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://test", headers={"authorization": "Bearer tester"}
    ) as client:

        async def pay(key: str) -> httpx.Response:
            headers = {"idempotency-key": f'"{key}"', "authorization": "Bearer a"}
            return await client.post("/payments", json={"amount": 1}, headers=headers)

        assert (await pay("warm-up")).status_code == 201  # connects, prepares statements
        (await trips.settled()).clear()
        assert (await pay("first")).status_code == 201
        await trips.settled()
        first = (list(trips.sent), trips.round_trips)
        trips.clear()
        replay = await pay("first")
        await trips.settled()
    assert replay.headers["idempotent-replayed"] == "true"
    # get, claim (INSERT … ON CONFLICT … RETURNING), fenced UPDATE: all autocommitted.
    assert first == (["SELECT", "INSERT", "UPDATE"], 3)
    assert trips.sent == ["SELECT"]
    assert trips.transactions == 0
    assert all(trips.autocommitted)
