"""fenced_update on real PostgreSQL (asyncpg) and SQLite (aiosqlite)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from headway.lock.fencing import fenced_update, fenced_update_statement, fenced_update_sync

pytestmark = pytest.mark.anyio


class Tables:
    def __init__(self) -> None:
        suffix = uuid.uuid4().hex[:12]
        self.metadata = sa.MetaData()
        self.register = sa.Table(
            f"hw_fence_reg_{suffix}",
            self.metadata,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("value", sa.Integer, nullable=False),
            sa.Column("fence", sa.BigInteger),
        )
        # Written in the same transaction as each accepted update, while the row
        # (PostgreSQL) or the database (SQLite) is locked: ids give the accept order.
        self.history = sa.Table(
            f"hw_fence_hist_{suffix}",
            self.metadata,
            sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("writer", sa.Integer, nullable=False),
            sa.Column("fence", sa.BigInteger, nullable=False),
        )


@pytest.fixture(params=["postgres", "sqlite"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    if request.param == "postgres":
        url = request.getfixturevalue("postgres_url")
        eng = create_async_engine(url, pool_size=20)
    else:
        eng = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'fence.db'}")
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
async def tables(engine: AsyncEngine) -> AsyncIterator[Tables]:
    t = Tables()
    async with engine.begin() as conn:
        await conn.run_sync(t.metadata.create_all)
        await conn.execute(sa.insert(t.register).values(id=1, value=0, fence=5))
    try:
        yield t
    finally:
        async with engine.begin() as conn:
            await conn.run_sync(t.metadata.drop_all)


async def row(engine: AsyncEngine, t: Tables) -> tuple[int, int | None]:
    async with engine.connect() as conn:
        got = (await conn.execute(sa.select(t.register.c.value, t.register.c.fence))).one()
    return got.value, got.fence


async def write(engine: AsyncEngine, t: Tables, fence: int, value: int) -> bool:
    async with engine.begin() as conn:
        return await fenced_update(conn, t.register, {"id": 1}, {"value": value}, fence=fence)


async def test_stale_rejected_equal_and_higher_accepted(
    engine: AsyncEngine, tables: Tables
) -> None:
    assert await write(engine, tables, 4, 10) is False
    assert await row(engine, tables) == (0, 5)
    assert await write(engine, tables, 5, 11) is True  # the same holder writing again
    assert await row(engine, tables) == (11, 5)
    assert await write(engine, tables, 9, 12) is True
    assert await row(engine, tables) == (12, 9)
    assert await write(engine, tables, 8, 13) is False
    assert await write(engine, tables, 5, 13) is False
    assert await row(engine, tables) == (12, 9)


async def test_missing_row_is_not_accepted(engine: AsyncEngine, tables: Tables) -> None:
    async with engine.begin() as conn:
        where = tables.register.c.id == 2
        assert await fenced_update(conn, tables.register, where, {"value": 1}, fence=99) is False


async def test_null_fence_accepts_any_token(engine: AsyncEngine, tables: Tables) -> None:
    async with engine.begin() as conn:
        await conn.execute(sa.insert(tables.register).values(id=2, value=0, fence=None))
        reg = tables.register
        ok = await fenced_update(conn, reg, reg.c.id == 2, {"value": reg.c.value + 1}, fence=0)
        assert ok is True
        got = (await conn.execute(sa.select(reg.c.value, reg.c.fence).where(reg.c.id == 2))).one()
    assert tuple(got) == (1, 0)


async def test_session_and_custom_fence_column(engine: AsyncEngine) -> None:
    metadata = sa.MetaData()
    table = sa.Table(
        f"hw_fence_col_{uuid.uuid4().hex[:12]}",
        metadata,
        sa.Column("k", sa.String(20), primary_key=True),
        sa.Column("body", sa.String(20)),
        sa.Column("lease_fence", sa.BigInteger, nullable=False),
    )
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    try:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(sa.insert(table).values(k="a", body="old", lease_fence=3))
            where = {"k": "a"}
            stale = await fenced_update(
                session, table, where, {"body": "stale"}, fence=2, fence_column="lease_fence"
            )
            fresh = await fenced_update(
                session, table, where, {"body": "new"}, fence=7, fence_column="lease_fence"
            )
            assert (stale, fresh) == (False, True)
            got = (await session.execute(sa.select(table.c.body, table.c.lease_fence))).one()
            assert tuple(got) == ("new", 7)
    finally:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)


async def test_several_matching_rows_raise(engine: AsyncEngine, tables: Tables) -> None:
    async with engine.connect() as conn:
        await conn.execute(sa.insert(tables.register).values(id=2, value=0, fence=1))
        reg = tables.register
        with pytest.raises(ValueError, match="matched 2"):
            await fenced_update(conn, reg, reg.c.id > 0, {"value": 3}, fence=10)
        await conn.rollback()


def test_statement_arguments_checked() -> None:
    t = Tables()
    with pytest.raises(ValueError, match="fence column"):
        fenced_update_statement(t.register, {"id": 1}, {"fence": 3}, fence=3)
    with pytest.raises(ValueError, match="no condition"):
        fenced_update_statement(t.register, {}, {"value": 3}, fence=3)
    with pytest.raises(TypeError, match="int"):
        fenced_update_statement(t.register, {"id": 1}, {"value": 3}, fence=True)
    with pytest.raises(TypeError, match="int"):
        fenced_update_statement(t.register, {"id": 1}, {"value": 3}, fence=2.0)  # type: ignore[arg-type]


def test_sync_shell(tmp_path: Path) -> None:
    t = Tables()
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'sync.db'}")
    try:
        with eng.begin() as conn:
            t.metadata.create_all(conn)
            conn.execute(sa.insert(t.register).values(id=1, value=0, fence=5))
        with eng.begin() as conn:
            assert fenced_update_sync(conn, t.register, {"id": 1}, {"value": 1}, fence=4) is False
            assert fenced_update_sync(conn, t.register, {"id": 1}, {"value": 2}, fence=6) is True
        with sa.orm.Session(eng) as session, session.begin():
            assert fenced_update_sync(session, t.register, {"id": 1}, {"value": 3}, fence=6)
        with eng.connect() as conn:
            assert tuple(conn.execute(sa.select(t.register.c.value, t.register.c.fence)).one()) == (
                3,
                6,
            )
    finally:
        eng.dispose()


async def test_concurrent_writers_keep_the_highest_fence(
    engine: AsyncEngine, tables: Tables
) -> None:
    writers = 60
    rng = random.Random()
    fences = [rng.randint(1, 30) for _ in range(writers)]
    start = asyncio.Event()
    reg, hist = tables.register, tables.history

    async def writer(i: int) -> bool:
        await start.wait()
        async with engine.begin() as conn:
            ok = await fenced_update(
                conn, reg, {"id": 1}, {"value": reg.c.value + 1}, fence=fences[i]
            )
            if ok:
                await conn.execute(sa.insert(hist).values(writer=i, fence=fences[i]))
            return ok

    tasks = [asyncio.ensure_future(writer(i)) for i in range(writers)]
    start.set()
    accepted = await asyncio.gather(*tasks)

    async with engine.connect() as conn:
        log = (
            await conn.execute(sa.select(hist.c.writer, hist.c.fence).order_by(hist.c.seq))
        ).all()
    value, fence = await row(engine, tables)
    log_fences = [f for _, f in log]
    # Accept order never goes back to a lower token.
    assert log_fences == sorted(log_fences)
    assert sorted(w for w, _ in log) == [i for i in range(writers) if accepted[i]]
    # No lost increments: one per accepted write, none for a rejected one.
    assert value == len(log) == sum(accepted)
    # The highest token can never be rejected; every rejection was justified.
    assert fence == max(fences) == log_fences[-1]
    assert all(fences[i] < fence for i in range(writers) if not accepted[i])
    # The initial fence (5) was enforced.
    assert all(not accepted[i] for i in range(writers) if fences[i] < 5)
