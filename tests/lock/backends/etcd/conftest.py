"""etcd's fixtures: a backend on the shared server (a namespace of its own), and a
throw-away 3-member cluster (healed before each test that uses it)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from headway import EtcdLockBackend
from tests.conftest import need
from tests.etcd_servers import EtcdCluster


@pytest.fixture
def namespace() -> str:
    return f"headway-test/{uuid.uuid4().hex}/"


@pytest.fixture
async def etcd(etcd_url: str, namespace: str) -> AsyncIterator[EtcdLockBackend]:
    backend = EtcdLockBackend(etcd_url, namespace=namespace)
    try:
        yield backend
    finally:
        await backend.aclose()


@pytest.fixture(scope="package")
def etcd_cluster_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    binary = shutil.which("etcd")
    if binary is None:
        need("etcd binary", "not on PATH (needed for the 3-member cluster tests)")
        raise AssertionError("unreachable")
    cluster = EtcdCluster(binary, tmp_path_factory.mktemp("etcd"))
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture
def etcd_cluster(etcd_cluster_once: EtcdCluster) -> EtcdCluster:
    """The cluster with every member up and a leader."""
    for member in etcd_cluster_once.members:
        if not member.alive():
            etcd_cluster_once.start(member)
    etcd_cluster_once.wait_for_leader(30)
    return etcd_cluster_once
