"""``RecordStore.from_url``: a pool that keeps its connections under concurrency, engine
options passed through, and URLs it cannot use refused with one line of advice."""

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import QueuePool

from headway import RecordStore
from headway.idempotency.record import ClaimOutcome
from headway.idempotency.table import metadata, records

pytestmark = pytest.mark.anyio

TASKS = 16


def pool_of(store: RecordStore) -> QueuePool:
    pool = store.engine.pool
    assert isinstance(pool, QueuePool)
    return pool


@pytest.mark.postgres
async def test_sixteen_concurrent_claims_open_no_connection_after_the_first_round(
    postgres_url: str,
) -> None:
    store = RecordStore.from_url(postgres_url, ttl=60)  # as a user writes it: no tuning
    opened = 0

    def connected(*_: Any) -> None:
        nonlocal opened
        opened += 1

    sa.event.listen(store.engine.sync_engine, "connect", connected)
    async with store.engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(records.delete())
    try:
        after: list[int] = []
        for round_ in range(3):
            await asyncio.gather(
                *(
                    store.claim(f"r{round_}", f"k{i}", "f" * 64,
                                fence=None, lease_token="t", lease_ttl=30)
                    for i in range(TASKS)
                )
            )  # fmt: skip
            after.append(opened)
        # SQLAlchemy's default pool (5 + 10 overflow) closes each overflow connection it
        # gets back, so every round beyond five in flight opened them again.
        assert after[1:] == [after[0], after[0]], after
        pool = pool_of(store)  # every connection opened is still open: idle or kept
        assert pool.checkedin() + pool.checkedout() == opened
    finally:
        async with store.engine.begin() as conn:
            await conn.execute(records.delete())
        await store.aclose()


async def test_engine_options_reach_the_engine_and_replace_the_defaults() -> None:
    store = RecordStore.from_url(
        "postgresql+asyncpg://app@db.invalid/app",
        ttl=60,
        timeout=2,
        engine_options={"pool_size": 3, "echo": True},
    )
    assert pool_of(store).size() == 3
    assert store.engine.echo is True
    assert (store.ttl, store.timeout) == (60, 2)
    default = RecordStore.from_url("postgresql+asyncpg://app@db.invalid/app")
    assert pool_of(default).size() >= TASKS


async def test_sqlite_in_memory_keeps_sqlalchemys_pool() -> None:
    # An in-memory database lives in one connection (a StaticPool): no pool sizes apply.
    store = RecordStore.from_url("sqlite+aiosqlite:///:memory:", ttl=60)
    try:
        claim = await store.claim("s", "k", "f" * 64, fence=None, lease_token="t", lease_ttl=30)
        assert claim.outcome is ClaimOutcome.CLAIMED
        assert (await store.get("s", "k")) is not None
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    ("url", "error", "advice"),
    [
        ("sqlite:///x.db", ValueError, "use sqlite+aiosqlite:///x.db"),
        ("mysql+pymysql://u:secret@h/db", ValueError, "use mysql+aiomysql://u:***@h/db"),
        (
            "postgresql://u:secret@h/db",  # psycopg is not installed here
            ImportError,
            "use postgresql+asyncpg://u:***@h/db (pip install 'headway[postgres]')",
        ),
        ("mysql://h/db", ImportError, "pip install 'headway[mysql]'"),
        ("nosuch://h/db", ValueError, "headway runs on postgresql+asyncpg://"),
        ("not a url", ValueError, "is not a database URL"),
    ],
)
def test_urls_it_cannot_use_are_refused_with_one_line_of_advice(
    url: str, error: type[Exception], advice: str
) -> None:
    with pytest.raises(error) as raised:
        RecordStore.from_url(url)
    message = str(raised.value)
    assert advice in message
    assert "\n" not in message
    assert "secret" not in message


def test_a_missing_async_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "asyncpg", None)  # as if not installed
    with pytest.raises(ImportError) as raised:
        RecordStore.from_url("postgresql+asyncpg://u:secret@h/db")
    assert str(raised.value) == (
        "postgresql+asyncpg://u:***@h/db needs the driver asyncpg, which is not installed: "
        "pip install 'headway[postgres]'"
    )
