"""The backends the shared lock suite (``test_lock.py``) runs over: one entry each in
``QUEUED_BACKENDS``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis import asyncio as aioredis

from headway import MemoryLockBackend, RedisLockBackend
from headway.lock.driver import QueuedBackend


@contextlib.asynccontextmanager
async def _memory(request: pytest.FixtureRequest) -> AsyncIterator[QueuedBackend]:
    yield MemoryLockBackend()


@contextlib.asynccontextmanager
async def _redis(request: pytest.FixtureRequest) -> AsyncIterator[QueuedBackend]:
    client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    await client.flushdb()
    backend = RedisLockBackend(client)
    try:
        yield backend
    finally:
        await backend.aclose()
        await client.aclose()


#: name -> a context manager that makes the backend on a clean server (fixtures through
#: ``request``) and closes it. A new queued backend is one entry here.
QUEUED_BACKENDS: dict[str, Callable[[Any], contextlib.AbstractAsyncContextManager[QueuedBackend]]]
QUEUED_BACKENDS = {"memory": _memory, "redis": _redis}


@pytest.fixture(params=list(QUEUED_BACKENDS))
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[QueuedBackend]:
    """Every queued backend in turn: the in-memory reference, Redis (flushed db), ..."""
    async with QUEUED_BACKENDS[request.param](request) as made:
        yield made
