"""The MySQL/MariaDB lock backend's fixtures: an engine, the backend, a fresh resource name."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from headway.lock.backends.mysql import MySQLLockBackend


@pytest.fixture
async def engine(mysql_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(mysql_url, pool_size=16, max_overflow=8)
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
async def backend(engine: AsyncEngine) -> AsyncIterator[MySQLLockBackend]:
    b = MySQLLockBackend(engine)
    try:
        yield b
    finally:
        await b.aclose()


@pytest.fixture
def resource() -> str:
    return f"test-{uuid.uuid4().hex}"
