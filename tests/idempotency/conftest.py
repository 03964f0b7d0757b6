"""One record store per database: SQLite (a temp file), PostgreSQL, MariaDB; and, for the
suite over ``RecordBackend`` alone (``record_backend``), the toy store too."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from headway import RecordBackend, RecordStore
from headway.idempotency.table import metadata, records
from tests.idempotency.toy_store import ToyRecordStore

DATABASES = [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


def _url(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'headway.sqlite3'}"
    fixture = "postgres_url" if kind == "postgresql" else "mysql_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLAlchemy async URL for each database kind."""
    return _url(request, request.param, tmp_path)


@contextlib.asynccontextmanager
async def _fresh_store(url: str) -> AsyncIterator[RecordStore]:
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
        await conn.run_sync(metadata.create_all)
    store = RecordStore(engine, ttl=60)
    try:
        yield store
    finally:
        async with engine.begin() as conn:
            await conn.execute(records.delete())
        await engine.dispose()


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[RecordStore]:
    """A store on an empty, freshly created table."""
    async with _fresh_store(database_url) as made:
        yield made


@pytest.fixture(params=["toy", *DATABASES])
async def record_backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[RecordBackend]:
    """Each store the ``RecordBackend`` suite runs over, empty: the toy, then each database's."""
    if request.param == "toy":  # a dict behind the contract (toy_store.py)
        yield ToyRecordStore(ttl=60)
        return
    async with _fresh_store(_url(request, request.param, tmp_path)) as made:
        yield made
