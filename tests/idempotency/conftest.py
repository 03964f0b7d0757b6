"""One record store per database: SQLite (a temp file), PostgreSQL, MariaDB."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from headway import RecordStore
from headway.idempotency.table import metadata, records

DATABASES = [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLAlchemy async URL for each database kind."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'headway.sqlite3'}"
    fixture = "postgres_url" if request.param == "postgresql" else "mysql_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[RecordStore]:
    """A store on an empty, freshly created table."""
    engine = create_async_engine(database_url)
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
