"""The backends the shared lock suites run over: one entry each in ``LOCK_BACKENDS``
(async, for ``test_lock.py``, ``test_lock_hold.py``, ``test_queued.py``, and
``test_modes.py`` through ``modal_backend``) and in ``SYNC_LOCK_BACKENDS`` (for
``test_sync_lock.py``, and ``test_sync_modes.py`` through ``sync_modal_backend``).

A test that needs more than the contract asks for it with
``@pytest.mark.needs("capability")`` (one of ``CAPABILITIES``);
a backend that cannot offer a capability by design says so, with the reason, in its
entry's ``lacks``, and such tests are not generated for it (nothing is skipped). The
modal fixtures need ``modes`` of every test: they are the same tables' entries that
offer read-write locks and semaphores.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from redis import asyncio as aioredis
from sqlalchemy.ext.asyncio import create_async_engine

from headway import EtcdLockBackend, MemoryLockBackend, RedisLockBackend, SyncRedisLockBackend
from headway.lock.backends.mysql import MySQLLockBackend, SyncMySQLLockBackend
from headway.lock.backends.postgres import PostgresLockBackend
from headway.lock.backends.redlock import RedlockBackend
from headway.lock.backends.sync_twins import (
    SyncEtcdLockBackend,
    SyncPostgresLockBackend,
    SyncRedlockBackend,
    SyncZooKeeperLockBackend,
)
from headway.lock.contract import (
    LockBackend,
    ModalLockBackend,
    SyncLockBackend,
    SyncModalLockBackend,
)
from tests import zookeeper_server
from tests.lock.toy_backend import ToyLockBackend
from tests.servers import RedisServers
from tests.zookeeper_server import ZooKeeperServer

#: What a test may need beyond the contract, and what that means.
CAPABILITIES = {
    "queued": "a QueuedBackend: the driver's primitives (_try, _attempt) can be watched",
    "fifo": "waiters are granted the lock in the order they asked",
    "fair": "under steady contention every task gets a share (a releaser cannot cut in)",
    "short_ttl": "a lease of a fraction of a second runs out on time",
    "inspect": "tells who holds a lock and how many wait (InspectableLockBackend)",
    "owner": "names each holder by its Lock's owner label (Holder.owner)",
    "line": "keeps its waiters in a line that inspect counts (LockState.waiting)",
    "modes": "a ModalLockBackend: read, write and permits (ReadWriteLock, Semaphore)",
}


@dataclass(frozen=True)
class Entry:
    """A backend of a shared suite: ``make`` is a context manager that makes it on a
    clean server (fixtures through ``request``) and closes it; ``lacks`` maps each
    capability it cannot offer by design to the reason."""

    make: Callable[[pytest.FixtureRequest], Any]
    lacks: Mapping[str, str] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def _memory(request: pytest.FixtureRequest) -> AsyncIterator[LockBackend]:
    yield MemoryLockBackend()


@contextlib.asynccontextmanager
async def _toy(request: pytest.FixtureRequest) -> AsyncIterator[LockBackend]:
    yield ToyLockBackend()


@contextlib.asynccontextmanager
async def _redis(request: pytest.FixtureRequest) -> AsyncIterator[LockBackend]:
    client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    await client.flushdb()
    backend = RedisLockBackend(client)
    try:
        yield backend
    finally:
        await backend.aclose()
        await client.aclose()


@pytest.fixture(scope="session")
def redlock_urls(redis_servers: RedisServers) -> Iterator[list[str]]:
    """Three throw-away redis-servers for the shared suite's Redlock entry."""
    nodes = [redis_servers.start() for _ in range(3)]
    try:
        yield [node.url for node in nodes]
    finally:
        for node in nodes:
            redis_servers.stop(node)


@contextlib.asynccontextmanager
async def _redlock(request: pytest.FixtureRequest) -> AsyncIterator[LockBackend]:
    urls = request.getfixturevalue("redlock_urls")
    for url in urls:
        async with aioredis.Redis.from_url(url) as node:
            await node.flushall()
    # Generous per-node timeout: the test machine is shared, a slow node costs a retry.
    backend = RedlockBackend.from_urls(urls, node_timeout=0.25, retry_delay=(0.001, 0.01))
    try:
        yield backend
    finally:
        await backend.aclose()


@contextlib.asynccontextmanager
async def _postgres(request: pytest.FixtureRequest) -> AsyncIterator[LockBackend]:
    engine = create_async_engine(request.getfixturevalue("postgres_url"), pool_size=16)
    backend = PostgresLockBackend(engine)
    try:
        yield backend
    finally:
        await backend.aclose()
        await engine.dispose()


@contextlib.asynccontextmanager
async def _mysql(request: pytest.FixtureRequest) -> AsyncIterator[LockBackend]:
    # Lock names are hashed with the database's name: test_h8's do not meet other databases'.
    engine = create_async_engine(request.getfixturevalue("mysql_url"), pool_size=16)
    backend = MySQLLockBackend(engine)
    try:
        yield backend
    finally:
        await backend.aclose()
        await engine.dispose()


@contextlib.asynccontextmanager
async def _etcd(request: pytest.FixtureRequest) -> AsyncIterator[LockBackend]:
    # The etcd server is shared: a namespace of its own is this test's clean server.
    namespace = f"headway-test/{uuid.uuid4().hex}/"
    backend = EtcdLockBackend(request.getfixturevalue("etcd_url"), namespace=namespace)
    try:
        yield backend
    finally:
        await backend.aclose()


@contextlib.asynccontextmanager
async def _zookeeper(request: pytest.FixtureRequest) -> AsyncIterator[LockBackend]:
    from headway import ZooKeeperLockBackend

    hosts = request.getfixturevalue("zookeeper_hosts")
    # A folder of its own on the shared server; ending the session deletes its nodes.
    prefix = f"/headway-test/{uuid.uuid4().hex}"
    backend = ZooKeeperLockBackend(hosts, session_timeout=30.0, prefix=prefix)
    try:
        yield backend
    finally:
        await backend.aclose()


@pytest.fixture(scope="session")
def fast_zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A throw-away ZooKeeper with 100 ms ticks: sessions (leases) can be a second long."""
    from tests.conftest import need

    if (why := zookeeper_server.available()) is not None:
        need("a throw-away ZooKeeper", why)
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


_NO_QUEUE = "no queue of its own: the driver's primitives do not exist"
_NO_OWNER = "a session's user-level lock keeps no token, and the session no label others read"
_NO_MODES_MYSQL = "GET_LOCK has no shared mode and no counted one"
_NO_MODES_REDLOCK = "no queue on its nodes to hold readers, writers and permits in order"

#: name -> entry. A new async backend is one entry here.
LOCK_BACKENDS: dict[str, Entry] = {
    "memory": Entry(_memory),
    "redis": Entry(_redis),
    "redlock": Entry(
        _redlock,
        lacks={
            "queued": _NO_QUEUE + " (rounds of SET NX on every node)",
            "line": "no queue: inspect's waiting is always 0",
            "fifo": "no queue: a waiter retries after a random delay, whoever is first wins",
            "fair": "no queue: a releaser asks again at once while rivals sleep their delay",
            "modes": _NO_MODES_REDLOCK,
        },
    ),
    "postgres": Entry(
        _postgres,
        # Its waiters queue in the server's lock manager, first come, first served: only
        # the tests that watch the driver's attempts cannot run over it.
        lacks={"queued": _NO_QUEUE + " (the server's lock manager queues waiters)"},
    ),
    "mysql": Entry(
        _mysql,
        # GET_LOCK waits in the server's metadata-lock queue: a release grants the oldest
        # waiter inside the server (measured FIFO in 50 of 50 trials on MariaDB 10.11,
        # pinned by test_waiters_are_granted_in_arrival_order), so fifo and fair hold.
        lacks={
            "queued": _NO_QUEUE + " (the server's GET_LOCK waits)",
            "owner": _NO_OWNER,
            "short_ttl": "the TTL is the session's wait_timeout, in whole seconds: a 0.1 s "
            "lease is held on the server for 1 s",
            "modes": _NO_MODES_MYSQL,
        },
    ),
    "etcd": Entry(
        _etcd,
        lacks={
            "short_ttl": "etcd counts lease TTLs in whole seconds, at least its minimum "
            "(2 s by default): a 0.1 s lease is held on the server for 2 s",
        },
    ),
    "zookeeper": Entry(_zookeeper),
    # LockBackend implemented directly from the contract's docstrings (toy_backend.py)
    "toy": Entry(
        _toy,
        lacks={
            "queued": _NO_QUEUE + " (it implements LockBackend directly)",
            "inspect": "the contract's minimum: acquire, release, extend",
            "modes": "the contract's minimum: no for_mode",
        },
    ),
}


@contextlib.contextmanager
def _sync_redis(
    request: pytest.FixtureRequest, *, own_connection: bool
) -> Iterator[SyncLockBackend]:
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    client.flushdb()
    backend = SyncRedisLockBackend(client, own_connection=own_connection)
    try:
        yield backend
    finally:
        backend.close()
        client.close()


@contextlib.contextmanager
def _sync_mysql(request: pytest.FixtureRequest) -> Iterator[SyncLockBackend]:
    url = sa.make_url(request.getfixturevalue("mysql_url")).set(drivername="mysql+pymysql")
    backend = SyncMySQLLockBackend.from_url(url.render_as_string(False), pool_size=16)
    try:
        yield backend
    finally:
        backend.close()


@contextlib.contextmanager
def _sync_postgres(request: pytest.FixtureRequest) -> Iterator[SyncModalLockBackend]:
    backend = SyncPostgresLockBackend(request.getfixturevalue("postgres_url"), pool_size=16)
    try:
        yield backend
    finally:
        backend.close()


@contextlib.contextmanager
def _sync_redlock(request: pytest.FixtureRequest) -> Iterator[SyncLockBackend]:
    urls = request.getfixturevalue("redlock_urls")
    for url in urls:
        with redis.Redis.from_url(url) as node:
            node.flushall()
    backend = SyncRedlockBackend.from_urls(urls, node_timeout=0.25, retry_delay=(0.001, 0.01))
    try:
        yield backend
    finally:
        backend.close()


@contextlib.contextmanager
def _sync_etcd(request: pytest.FixtureRequest) -> Iterator[SyncModalLockBackend]:
    namespace = f"headway-test/{uuid.uuid4().hex}/"
    backend = SyncEtcdLockBackend(request.getfixturevalue("etcd_url"), namespace=namespace)
    try:
        yield backend
    finally:
        backend.close()


@contextlib.contextmanager
def _sync_zookeeper(request: pytest.FixtureRequest) -> Iterator[SyncModalLockBackend]:
    hosts = request.getfixturevalue("zookeeper_hosts")
    prefix = f"/headway-test/{uuid.uuid4().hex}"
    backend = SyncZooKeeperLockBackend(hosts, session_timeout=30.0, prefix=prefix)
    try:
        yield backend
    finally:
        backend.close()


#: name -> entry, for ``SyncLock``. A new sync backend is one entry here.
SYNC_LOCK_BACKENDS: dict[str, Entry] = {
    # headway's own sockets, with riding (a thread asking for a lock another holds)
    "redis": Entry(lambda request: _sync_redis(request, own_connection=True)),
    # every call through redis-py (as for Cluster clients): no riding
    "redis-py": Entry(lambda request: _sync_redis(request, own_connection=False)),
    "mysql": Entry(
        _sync_mysql,
        lacks={
            "owner": _NO_OWNER,
            "short_ttl": "the TTL is the session's wait_timeout, in whole seconds: a 0.1 s "
            "lease is held on the server for 1 s",
            "modes": _NO_MODES_MYSQL,
        },
    ),
    # The async backends on a private event loop (``blocking``): their own lacks.
    "postgres": Entry(_sync_postgres, lacks=LOCK_BACKENDS["postgres"].lacks),
    "redlock": Entry(_sync_redlock, lacks=LOCK_BACKENDS["redlock"].lacks),
    "etcd": Entry(_sync_etcd, lacks=LOCK_BACKENDS["etcd"].lacks),
    "zookeeper": Entry(_sync_zookeeper, lacks=LOCK_BACKENDS["zookeeper"].lacks),
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(*capabilities): run over the lock backends that offer them"
    )


#: fixture -> (its table, what every test of the fixture needs)
_TABLES: Mapping[str, tuple[Mapping[str, Entry], frozenset[str]]] = {
    "lock_backend": (LOCK_BACKENDS, frozenset()),
    "sync_lock_backend": (SYNC_LOCK_BACKENDS, frozenset()),
    "modal_backend": (LOCK_BACKENDS, frozenset({"modes"})),
    "sync_modal_backend": (SYNC_LOCK_BACKENDS, frozenset({"modes"})),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    needed = {c for mark in metafunc.definition.iter_markers("needs") for c in mark.args}
    assert needed <= CAPABILITIES.keys(), f"unknown capabilities {needed - CAPABILITIES.keys()}"
    for fixture, (table, always) in _TABLES.items():
        if fixture in metafunc.fixturenames:
            wanted = needed | always
            names = [name for name, entry in table.items() if not wanted & entry.lacks.keys()]
            assert names, f"{metafunc.definition.name}: no backend offers {wanted}"
            metafunc.parametrize(fixture, names, indirect=True)


@pytest.fixture
async def lock_backend(request: pytest.FixtureRequest) -> AsyncIterator[LockBackend]:
    """Each entry of ``LOCK_BACKENDS`` that offers what the test ``needs``, in turn."""
    async with LOCK_BACKENDS[request.param].make(request) as made:
        yield made


@pytest.fixture
async def modal_backend(request: pytest.FixtureRequest) -> AsyncIterator[ModalLockBackend]:
    """Each entry of ``LOCK_BACKENDS`` with ``modes`` and what the test ``needs``, in turn."""
    async with LOCK_BACKENDS[request.param].make(request) as made:
        yield made


@pytest.fixture
def sync_modal_backend(request: pytest.FixtureRequest) -> Iterator[SyncModalLockBackend]:
    """Each entry of ``SYNC_LOCK_BACKENDS`` with ``modes`` and what the test ``needs``."""
    with SYNC_LOCK_BACKENDS[request.param].make(request) as made:
        yield made


@pytest.fixture
def sync_lock_backend(request: pytest.FixtureRequest) -> Iterator[SyncLockBackend]:
    """Each entry of ``SYNC_LOCK_BACKENDS`` that offers what the test ``needs``, in turn."""
    with SYNC_LOCK_BACKENDS[request.param].make(request) as made:
        yield made
