"""Fixtures of the ZooKeeper backend's own tests: a unique folder on the shared server,
a plain kazoo client to look at the nodes, and backends (one session each) on it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from kazoo.client import KazooClient

from headway import ZooKeeperLockBackend


@pytest.fixture
def zk_prefix() -> str:
    return f"/headway-test/{uuid.uuid4().hex}"


@pytest.fixture
def kazoo(zookeeper_hosts: str) -> Iterator[KazooClient]:
    """A plain kazoo client, to look at the nodes the backend leaves."""
    client = KazooClient(hosts=zookeeper_hosts, timeout=10.0)
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@contextlib.asynccontextmanager
async def backends_on(hosts: str, prefix: str) -> AsyncIterator[Callable[[], ZooKeeperLockBackend]]:
    """A maker of backends (each its own session) on ``hosts`` under ``prefix``;
    closes them after."""
    made: list[ZooKeeperLockBackend] = []

    def make() -> ZooKeeperLockBackend:
        backend = ZooKeeperLockBackend(hosts, prefix=prefix)
        made.append(backend)
        return backend

    try:
        yield make
    finally:
        for backend in made:
            await backend.aclose()


@pytest.fixture
async def make_backend(
    zookeeper_hosts: str, zk_prefix: str
) -> AsyncIterator[Callable[[], ZooKeeperLockBackend]]:
    """Makes backends (each its own session) under the test's folder; closes them after."""
    async with backends_on(zookeeper_hosts, zk_prefix) as make:
        yield make
