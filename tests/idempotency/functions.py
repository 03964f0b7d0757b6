"""Kits for the idempotent-function tests: a record store and a lock backend that go together.

``sqlite-memory`` is the embedded default (a SQLite file, the in-memory lock);
``postgresql-redis`` is production (PostgreSQL records, the Redis lock), on the real
servers. Sync functions keep their records on headway's background loop, so their
kits are opened and closed there (``portal_kit``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis import asyncio as aioredis
from sqlalchemy.ext.asyncio import create_async_engine

from headway import (
    IdempotentDecorator,
    LockBackend,
    MemoryLockBackend,
    RecordStore,
    RedisLockBackend,
    idempotent_function,
)
from headway.idempotency.portal import submit
from headway.idempotency.table import metadata, records

KITS = [
    "sqlite-memory",
    pytest.param("postgresql-redis", marks=[pytest.mark.postgres, pytest.mark.redis]),
]


@dataclass
class Kit:
    store: RecordStore
    lock: LockBackend
    redis: aioredis.Redis | None = None

    def decorator(self, **options: Any) -> IdempotentDecorator:
        """``idempotent_function`` on this kit's store and lock."""
        return idempotent_function(store=self.store, lock_backend=self.lock, **options)

    async def close(self) -> None:
        if self.redis is not None:  # the shared database; SQLite's file goes with tmp_path
            async with self.store.engine.begin() as conn:
                await conn.execute(records.delete())
        await self.store.aclose()
        if self.redis is not None:
            assert isinstance(self.lock, RedisLockBackend)
            await self.lock.aclose()
            await self.redis.aclose()


async def open_kit(kind: str, tmp_path: Path, urls: Callable[[str], str]) -> Kit:
    """A kit on an empty table (and a flushed Redis); ``urls`` gives a service's URL."""
    if kind == "sqlite-memory":
        url = f"sqlite+aiosqlite:///{tmp_path / 'functions.sqlite3'}"
        return Kit(RecordStore.from_url(url, ttl=60), MemoryLockBackend())
    engine = create_async_engine(urls("postgres_url"))
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(records.delete())
    redis = aioredis.Redis.from_url(urls("redis_url"))
    await redis.flushdb()
    return Kit(RecordStore(engine, ttl=60), RedisLockBackend(redis), redis)


def resolve(request: pytest.FixtureRequest) -> dict[str, str]:
    """The services' URLs (skipping, or failing in CI, when one is down)."""
    return {name: str(request.getfixturevalue(name)) for name in ("postgres_url", "redis_url")}


@contextmanager
def portal_kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    """A kit opened, used and closed on the portal's loop (for sync functions)."""
    kind = request.param
    urls = {} if kind == "sqlite-memory" else resolve(request)
    opened = submit(open_kit(kind, tmp_path, urls.__getitem__)).result(30)
    try:
        yield opened
    finally:
        submit(opened.close()).result(30)
