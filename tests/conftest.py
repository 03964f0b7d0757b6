"""Fixtures: real services from the environment, throw-away redis-servers.

Services come from ``HEADWAY_TEST_REDIS_URL`` and ``HEADWAY_TEST_DATABASE_URL``
(loopback defaults). Without a service, its tests skip with a reason; with
``CI`` set they fail instead, and any skip at all fails the run, so CI can
never go green while silently testing less.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from redis import asyncio as aioredis

from tests.servers import RedisServers
from tests.workers import Isolated

REDIS_URL = os.environ.get("HEADWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "HEADWAY_TEST_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("HEADWAY_TEST_MYSQL_URL", "mysql+aiomysql://root@127.0.0.1:3306/test")
ETCD_URL = os.environ.get("HEADWAY_TEST_ETCD_URL", "http://127.0.0.1:2379")
IN_CI = bool(os.environ.get("CI"))
ZOOKEEPER_HOSTS = os.environ.get("HEADWAY_TEST_ZOOKEEPER_HOSTS", "127.0.0.1:2181")


def need(service: str, why: str) -> None:
    """Skip (or, in CI, fail) because ``service`` is not available."""
    message = f"{service} is not available: {why}"
    if IN_CI:
        pytest.fail(f"{message} (CI is set: every service must be up)", pytrace=False)
    pytest.skip(message)


_isolated: Isolated | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, give this worker services of its own (``tests.workers``)."""
    global REDIS_URL, POSTGRES_URL, MYSQL_URL, _isolated
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    _isolated = Isolated(worker, REDIS_URL, POSTGRES_URL, MYSQL_URL)
    REDIS_URL, POSTGRES_URL, MYSQL_URL = (
        _isolated.redis_url, _isolated.postgres_url, _isolated.mysql_url,
    )  # fmt: skip
    os.environ["HEADWAY_TEST_REDIS_URL"] = REDIS_URL
    os.environ["HEADWAY_TEST_DATABASE_URL"] = POSTGRES_URL
    os.environ["HEADWAY_TEST_MYSQL_URL"] = MYSQL_URL


def pytest_unconfigure(config: pytest.Config) -> None:
    if _isolated is not None:
        _isolated.close()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    if IN_CI and skipped:
        terminalreporter.write_line(
            f"CI is set and {len(skipped)} test(s) were skipped: failing the run", red=True
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if IN_CI and reporter is not None and reporter.stats.get("skipped"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _port_open(url: str, default_port: int) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 1
        ):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> str:
    if not _port_open(REDIS_URL, 6379):
        need("Redis", f"nothing listens at {REDIS_URL} (set HEADWAY_TEST_REDIS_URL)")
    return REDIS_URL


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """An asyncio client on a flushed database."""
    client = aioredis.Redis.from_url(redis_url)
    await client.flushdb()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def sync_redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A sync client on a flushed database."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    if not _port_open(POSTGRES_URL, 5432):
        need("PostgreSQL", f"nothing listens at {POSTGRES_URL} (set HEADWAY_TEST_DATABASE_URL)")
    return POSTGRES_URL


@pytest.fixture(scope="session")
def mysql_url() -> str:
    if not _port_open(MYSQL_URL, 3306):
        need("MariaDB", f"nothing listens at {MYSQL_URL} (set HEADWAY_TEST_MYSQL_URL)")
    return MYSQL_URL


@pytest.fixture(scope="session")
def etcd_url() -> str:
    if not _port_open(ETCD_URL, 2379):
        need("etcd", f"nothing listens at {ETCD_URL} (set HEADWAY_TEST_ETCD_URL)")
    return ETCD_URL


@pytest.fixture(scope="session")
def zookeeper_hosts() -> str:
    """The shared ZooKeeper (``HEADWAY_TEST_ZOOKEEPER_HOSTS``); tests use a unique path prefix."""
    first = ZOOKEEPER_HOSTS.split(",")[0].split("/")[0]
    if not _port_open(f"zk://{first}", 2181):
        need(
            "ZooKeeper", f"nothing listens at {ZOOKEEPER_HOSTS} (set HEADWAY_TEST_ZOOKEEPER_HOSTS)"
        )
    return ZOOKEEPER_HOSTS


@pytest.fixture(scope="session")
def redis_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServers]:
    """Starts throw-away redis-server processes on free loopback ports; stops them by PID."""
    binary = shutil.which("redis-server")
    if binary is None:
        need("redis-server", "the binary is not on PATH (needed for Redlock and Cluster tests)")
        raise AssertionError("unreachable")
    servers = RedisServers(binary, tmp_path_factory.mktemp("redis"))
    try:
        yield servers
    finally:
        servers.stop_all()


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"
