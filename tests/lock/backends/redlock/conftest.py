"""Redlock's fixtures: the five nodes (healed before each test), the backend over them,
a plain client per node, a fresh resource name."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis import asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from headway.lock.backends.redlock import RedlockBackend
from tests.lock.backends.redlock.nodes import NODE_TIMEOUT, Nodes
from tests.servers import RedisServers


@pytest.fixture(scope="package")
def redlock_nodes(redis_servers: RedisServers) -> Iterator[Nodes]:
    nodes = Nodes(redis_servers)
    try:
        yield nodes
    finally:
        for node in nodes.nodes:
            redis_servers.stop(node)


@pytest.fixture
def nodes(redlock_nodes: Nodes) -> Nodes:
    """The five nodes, every one of them up (a test may have killed some)."""
    redlock_nodes.heal()
    return redlock_nodes


@pytest.fixture
async def backend(nodes: Nodes) -> AsyncIterator[RedlockBackend]:
    redlock = RedlockBackend.from_urls(
        nodes.urls, node_timeout=NODE_TIMEOUT, retry_delay=(0.001, 0.01)
    )
    try:
        yield redlock
    finally:
        await redlock.aclose()


@pytest.fixture
async def direct(nodes: Nodes) -> AsyncIterator[list[aioredis.Redis]]:
    """One plain client per node, to look at (and tamper with) what Redlock wrote."""
    clients = [
        aioredis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=1)
        for url in nodes.urls
    ]
    try:
        yield clients
    finally:
        for client in clients:
            await client.aclose()


@pytest.fixture
def resource() -> str:
    return f"redlock-{uuid.uuid4().hex}"
