"""Window claims (``lock/backends/windows.py``): ``run_once``'s windows in a table on
PostgreSQL and MySQL/MariaDB, judged by the database's clock, kept across the claimant's
end. ``test_once_fleet.py`` SIGKILLs a runner; here the claimant's engine is disposed."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from headway import (
    BackendUnavailable,
    FakeClock,
    MySQLLockBackend,
    PostgresLockBackend,
    Skipped,
    SyncMySQLLockBackend,
    run_once,
)
from headway.lock.backends.windows import WINDOW_TABLE, row_name

pytestmark = pytest.mark.anyio

DIALECTS = [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


def _name() -> str:
    return f"job-{uuid.uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def _backend(
    request: pytest.FixtureRequest, dialect: str, clock: FakeClock | None = None
) -> AsyncIterator[PostgresLockBackend | MySQLLockBackend]:
    engine = create_async_engine(request.getfixturevalue(f"{dialect}_url"), pool_size=10)
    backend: PostgresLockBackend | MySQLLockBackend
    if dialect == "postgres":
        backend = PostgresLockBackend(engine, clock=clock)
    else:
        backend = MySQLLockBackend(engine, clock=clock)
    try:
        yield backend
    finally:
        await backend.aclose()
        await engine.dispose()


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_claim_outlives_its_claimant(dialect: str, request: pytest.FixtureRequest) -> None:
    name = _name()
    async with _backend(request, dialect) as dead:
        assert await dead.claim_window(name, 0.5) is not None
    # Its engine is gone (every connection closed): the window stays held till at_most_for.
    async with _backend(request, dialect, clock=FakeClock(0.0)) as other:
        assert await other.claim_window(name, 5) is None
        # A frozen client clock changes nothing: the database's clock frees it.
        await asyncio.sleep(0.6)
        assert await other.claim_window(name, 5) is not None


async def test_the_end_keeps_the_window_at_least_for(
    dialect: str, request: pytest.FixtureRequest
) -> None:
    name = _name()
    async with _backend(request, dialect) as backend:
        lease = await backend.claim_window(name, 10)
        assert lease is not None
        assert await backend.end_window(lease, 0.3)
        assert await backend.claim_window(name, 10) is None
        await asyncio.sleep(0.35)
        again = await backend.claim_window(name, 10)
        assert again is not None
        assert again.fence > lease.fence
        # An at_least_for already spent frees the window at once.
        assert await backend.end_window(again, 0)
        assert await backend.claim_window(name, 10) is not None


async def test_a_claim_that_ran_out_ends_as_not_held(
    dialect: str, request: pytest.FixtureRequest
) -> None:
    name = _name()
    async with _backend(request, dialect) as backend:
        late = await backend.claim_window(name, 0.1)
        assert late is not None
        await asyncio.sleep(0.15)
        assert not await backend.end_window(late, 5)  # ran out: nothing kept
        taker = await backend.claim_window(name, 10)
        assert taker is not None
        assert not await backend.end_window(late, 0)  # the new claim is untouched
        assert await backend.claim_window(name, 10) is None
        assert await backend.end_window(taker, 0)


async def test_one_of_concurrent_claims_wins(dialect: str, request: pytest.FixtureRequest) -> None:
    name = _name()
    async with _backend(request, dialect) as backend:
        fences = []
        # First on a missing row (inserts race), then on a run-out one (updates race).
        for most in (0.2, 5):
            claims = await asyncio.gather(*(backend.claim_window(name, most) for _ in range(8)))
            won = [c for c in claims if c is not None]
            assert len(won) == 1, claims
            fences.append(won[0].fence)
            await asyncio.sleep(0.25)
        assert fences[1] > fences[0]


async def test_fences_rise_even_when_the_row_is_lost(
    dialect: str, request: pytest.FixtureRequest
) -> None:
    name = _name()
    async with _backend(request, dialect) as backend:
        fences = []
        for _ in range(3):
            lease = await backend.claim_window(name, 5)
            assert lease is not None
            fences.append(lease.fence)
            await backend.end_window(lease, 0)
        async with backend.engine.begin() as conn:
            table = sa.table(WINDOW_TABLE, sa.column("name"))
            await conn.execute(sa.delete(table).where(table.c.name == name))
        lease = await backend.claim_window(name, 5)
        assert lease is not None
        fences.append(lease.fence)
        assert fences == sorted(set(fences)), fences


async def test_long_names_keep_rows_of_their_own(
    dialect: str, request: pytest.FixtureRequest
) -> None:
    base = _name() + "é" * 300
    first, second = base + "a", base + "b"
    assert row_name(first) != row_name(second)
    assert len(row_name(first).encode()) <= 255
    async with _backend(request, dialect) as backend:
        assert await backend.claim_window(first, 5) is not None
        assert await backend.claim_window(second, 5) is not None
        assert await backend.claim_window(first, 5) is None


async def test_a_cancelled_claim_leaves_the_window_free(
    dialect: str, request: pytest.FixtureRequest
) -> None:
    async with _backend(request, dialect) as backend:
        for turns in range(0, 40, 3):
            name = _name()
            task = asyncio.create_task(backend.claim_window(name, 30))
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            try:
                lease = await task
            except asyncio.CancelledError:
                lease = None
            if lease is not None:  # it finished before the cancellation: end it
                await backend.end_window(lease, 0)
            assert await backend.claim_window(name, 30) is not None, turns


async def test_the_table_is_made_again_when_dropped(
    dialect: str, request: pytest.FixtureRequest
) -> None:
    async with _backend(request, dialect) as backend:
        assert await backend.claim_window(_name(), 5) is not None
        async with backend.engine.begin() as conn:
            await conn.execute(sa.text(f"DROP TABLE {WINDOW_TABLE}"))
        with pytest.raises(BackendUnavailable):
            await backend.claim_window(_name(), 5)
        assert await backend.claim_window(_name(), 5) is not None  # made on this claim


async def test_an_unreachable_database_is_unavailable(dialect: str) -> None:
    url = "postgresql+asyncpg://u@127.0.0.1:9/x" if dialect == "postgres" else None
    url = url or "mysql+aiomysql://u@127.0.0.1:9/x"
    engine = create_async_engine(url)
    kind: type[PostgresLockBackend | MySQLLockBackend]
    kind = PostgresLockBackend if dialect == "postgres" else MySQLLockBackend
    try:
        with pytest.raises(BackendUnavailable):
            await kind(engine, timeout=1).claim_window(_name(), 5)
    finally:
        await engine.dispose()


async def test_run_once_survives_its_runner(dialect: str, request: pytest.FixtureRequest) -> None:
    name = _name()
    async with _backend(request, dialect) as first, _backend(request, dialect) as second:
        job = run_once(first, name, at_most_for=10, at_least_for=0.3)(_quick)
        assert await job() == "done"
        await first.aclose()  # the process ends: the window stays held (at_least_for)
        other = run_once(second, name, at_most_for=10, at_least_for=0.3)(_quick)
        assert await other() == Skipped(name)
        await asyncio.sleep(0.35)
        assert await other() == "done"


async def _quick() -> str:
    return "done"


@pytest.fixture
def sync_mysql(request: pytest.FixtureRequest) -> Iterator[SyncMySQLLockBackend]:
    url = sa.make_url(request.getfixturevalue("mysql_url")).set(drivername="mysql+pymysql")
    engine = sa.create_engine(url, pool_size=10)
    backend = SyncMySQLLockBackend(engine)
    try:
        yield backend
    finally:
        backend.close()
        engine.dispose()


@pytest.mark.mysql
def test_sync_claims_across_threads(sync_mysql: SyncMySQLLockBackend) -> None:
    name, start = _name(), threading.Barrier(6)
    won: list[int] = []

    def claim() -> None:
        start.wait()
        lease = sync_mysql.claim_window(name, 5)
        if lease is not None:
            won.append(lease.fence)
            assert sync_mysql.end_window(lease, 0.2)

    threads = [threading.Thread(target=claim) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert sync_mysql.claim_window(name, 5) is None  # at_least_for is kept
    job = run_once(sync_mysql, name, at_most_for=5)(lambda: "done")
    assert job() == Skipped(name)
