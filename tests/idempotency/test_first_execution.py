"""A first execution costs its commits: round trips counted on real PostgreSQL."""

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from headway import MemoryLockBackend, RecordStore
from headway.idempotency.table import metadata, records
from tests.idempotency.apps import Bank, make_app

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


class RoundTrips:
    """Statements sent, plus BEGIN and COMMIT for every transaction that is not autocommitted."""

    def __init__(self) -> None:
        self.statements: list[str] = []
        self.transactions = 0

    @property
    def total(self) -> int:
        return len(self.statements) + 2 * self.transactions

    def statement(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements.append(statement.split(None, 1)[0])

    def begin(self, conn: Any) -> None:
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            self.transactions += 1


@pytest.fixture
async def counted(postgres_url: str) -> AsyncIterator[tuple[RecordStore, RoundTrips]]:
    engine = create_async_engine(postgres_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(records.delete())
    trips = RoundTrips()
    sa.event.listen(engine.sync_engine, "before_cursor_execute", trips.statement)
    sa.event.listen(engine.sync_engine, "begin", trips.begin)
    try:
        yield RecordStore(engine, ttl=60), trips
    finally:
        await engine.dispose()


async def test_first_execution_is_three_round_trips_and_replay_one(
    counted: tuple[RecordStore, RoundTrips],
) -> None:
    store, trips = counted
    app = make_app(Bank(), store=store, lock_backend=MemoryLockBackend())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

        async def pay(key: str) -> httpx.Response:
            headers = {"idempotency-key": f'"{key}"', "authorization": "Bearer a"}
            return await client.post("/payments", json={"amount": 1}, headers=headers)

        assert (await pay("warm-up")).status_code == 201  # connects, prepares statements
        trips.statements.clear()
        trips.transactions = 0
        assert (await pay("first")).status_code == 201
        first = (list(trips.statements), trips.total)
        trips.statements.clear()
        replay = await pay("first")
    assert replay.headers["idempotent-replayed"] == "true"
    # get, claim (INSERT … ON CONFLICT … RETURNING), fenced UPDATE: all autocommitted.
    assert first == (["SELECT", "INSERT", "UPDATE"], 3)
    assert trips.statements == ["SELECT"]
    assert trips.transactions == 0
