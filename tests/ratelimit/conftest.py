"""The backends the shared rate-limit suite runs over: one entry each in
``RATE_LIMIT_BACKENDS`` (``test_limiter.py``, ``test_leasing.py``,
``http/test_dynamic_policies.py``), and a dedicated Redis server for intrusive tests.

A test that needs more than the contract (decide, reset) asks for it with
``@pytest.mark.needs("capability")`` (one of ``CAPABILITIES``); a backend that does not
offer a capability says so, with the reason, in its entry's ``lacks``, and such tests
are not generated for it (nothing is skipped).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis import asyncio as aioredis

from headway import (
    ConcurrencyBackend,
    MemoryRateLimitBackend,
    RateLimitBackend,
    RedisRateLimitBackend,
)
from tests.ratelimit.toy_backend import DictBackend
from tests.servers import RedisServers, Server

#: Makes backends of one kind; on a store they share, two of them share its state.
BackendFactory = Callable[[], RateLimitBackend]

#: What a test may need beyond the contract, and what that means.
CAPABILITIES = {
    "lease": "leased quota: the backend's ``lease`` (``LeasingBackend``)",
    "reserve": "metered costs: the backend's ``reserve`` and ``settle`` (``ReservingBackend``)",
}


@dataclass(frozen=True)
class Entry:
    """A backend of the shared suite: ``make`` is an async context manager that yields a
    ``BackendFactory`` on a clean store (fixtures through ``request``) and closes it;
    ``lacks`` maps each capability it does not offer to the reason."""

    make: Callable[[pytest.FixtureRequest], Any]
    lacks: Mapping[str, str] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def _memory(request: pytest.FixtureRequest) -> AsyncIterator[BackendFactory]:
    yield MemoryRateLimitBackend


@contextlib.asynccontextmanager
async def _redis(request: pytest.FixtureRequest) -> AsyncIterator[BackendFactory]:
    client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    await client.flushdb()
    try:
        yield lambda: RedisRateLimitBackend(client)
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def _toy(request: pytest.FixtureRequest) -> AsyncIterator[BackendFactory]:
    yield DictBackend


#: name -> entry. A new backend is one entry here.
RATE_LIMIT_BACKENDS: dict[str, Entry] = {
    "memory": Entry(_memory),
    "redis": Entry(_redis),
    "toy": Entry(
        _toy, lacks={"reserve": "written before metered costs: a third party's backend need not"}
    ),
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(*capabilities): run over the backends that offer them"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "make_backend" not in metafunc.fixturenames:
        return
    needed = {c for mark in metafunc.definition.iter_markers("needs") for c in mark.args}
    assert needed <= CAPABILITIES.keys(), f"unknown capabilities {needed - CAPABILITIES.keys()}"
    names = [n for n, entry in RATE_LIMIT_BACKENDS.items() if not needed & entry.lacks.keys()]
    metafunc.parametrize("make_backend", names, indirect=True)


@pytest.fixture
async def make_backend(request: pytest.FixtureRequest) -> AsyncIterator[BackendFactory]:
    """Each entry of ``RATE_LIMIT_BACKENDS`` that offers what the test ``needs``, in turn."""
    async with RATE_LIMIT_BACKENDS[request.param].make(request) as factory:
        yield factory


@pytest.fixture(params=["memory", "redis"])
async def slot_backend(request: pytest.FixtureRequest) -> AsyncIterator[ConcurrencyBackend]:
    """A backend keeping concurrency slots; Redis through a pool for real concurrency."""
    if request.param == "memory":
        yield MemoryRateLimitBackend()
        return
    pool = aioredis.BlockingConnectionPool.from_url(
        request.getfixturevalue("redis_url"), max_connections=32
    )
    client = aioredis.Redis.from_pool(pool)
    await client.flushdb()
    try:
        yield RedisRateLimitBackend(client)
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def own_server(redis_servers: RedisServers) -> Iterator[Server]:
    """A redis-server of our own: for SCRIPT FLUSH, SIGSTOP and command counting."""
    server = redis_servers.start()
    try:
        yield server
    finally:
        redis_servers.stop(server)
