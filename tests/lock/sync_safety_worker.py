"""The clients of the safety test through the sync shells (``test_safety.py``).

As ``safety_worker`` (same register, log, checkpoints and parent), but each worker
holds the lock with ``SyncLock`` over a sync backend, from its main thread. The
register is written through the async engine on a private loop of its own
(``PrivateLoop``): the test machine has no sync PostgreSQL driver.

Usage: python -m tests.lock.sync_safety_worker BACKEND WORKERS TABLE RESOURCE TTL SOCKET
with BACKEND one of ``SYNC_BACKENDS`` and the environment of ``safety_worker`` (for
``sync-redlock``, HEADWAY_TEST_REDLOCK_URLS: the nodes' URLs separated by commas).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable

import redis
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from headway import LockNotOwned, SyncLock, SyncRedisLockBackend
from headway.lock.backends.blocking import BlockingLockBackend, PrivateLoop
from headway.lock.backends.mysql import SyncMySQLLockBackend
from headway.lock.backends.sync_twins import (
    SyncEtcdLockBackend,
    SyncPostgresLockBackend,
    SyncRedlockBackend,
    SyncZooKeeperLockBackend,
)
from headway.lock.contract import SyncLockBackend
from tests.lock.safety_worker import ZK_SESSION, Parent, fork, section

SYNC_BACKENDS = (
    "sync-redis",
    "sync-mysql",
    "sync-postgres",
    "sync-redlock",
    "sync-etcd",
    "sync-zookeeper",
)


Close = Callable[[], object]


def make_sync_backend(name: str) -> tuple[SyncLockBackend, list[Close]]:
    """The sync backend ``name`` over the environment's servers, and how to close it."""
    env = os.environ
    if name == "sync-redis":
        client = redis.Redis.from_url(env["HEADWAY_TEST_REDIS_URL"])
        redis_backend = SyncRedisLockBackend(client)
        return redis_backend, [redis_backend.close, client.close]
    if name == "sync-mysql":
        url = sa.make_url(env["HEADWAY_TEST_MYSQL_URL"]).set(drivername="mysql+pymysql")
        mysql = SyncMySQLLockBackend.from_url(url.render_as_string(False), pool_size=3)
        return mysql, [mysql.close]
    twin: BlockingLockBackend
    if name == "sync-postgres":
        twin = SyncPostgresLockBackend(env["HEADWAY_TEST_DATABASE_URL"], pool_size=3)
    elif name == "sync-redlock":
        urls = env["HEADWAY_TEST_REDLOCK_URLS"].split(",")
        twin = SyncRedlockBackend.from_urls(urls, node_timeout=0.25, retry_delay=(0.001, 0.01))
    elif name == "sync-etcd":
        twin = SyncEtcdLockBackend(env["HEADWAY_TEST_ETCD_URL"])
    else:
        assert name == "sync-zookeeper", name
        hosts = env["HEADWAY_TEST_ZOOKEEPER_HOSTS"]
        twin = SyncZooKeeperLockBackend(hosts, session_timeout=ZK_SESSION)
    return twin, [twin.close]


def run(
    backend_name: str, worker: int, table: str, resource: str, ttl: float, parent: Parent
) -> None:
    register = PrivateLoop("register")
    engine: AsyncEngine = create_async_engine(os.environ["HEADWAY_TEST_DATABASE_URL"])
    backend, closers = make_sync_backend(backend_name)
    lock = SyncLock(backend, resource, ttl=ttl, timeout=60)
    outcomes: list[tuple[int, bool]] = []
    lost_releases = 0
    try:
        # Warm the pool and the backend up before the start line.
        register.run(warm_up(engine))
        backend.release(backend.acquire(f"{resource}-warmup-{worker}", ttl, 5))
        parent.ask(f"ready {worker} {os.getpid()}")
        while True:
            lease = lock.acquire()
            last = parent.ask(f"held {lease.fence}") == "last"
            accepted = register.run(section(engine, table, worker, lease.fence, parent))
            outcomes.append((lease.fence, accepted))
            try:
                lock.release(lease)
            except LockNotOwned:
                lost_releases += 1
            if last:
                break
    finally:
        for close in closers:
            close()
        register.close(engine.dispose())
    parent.tell("done " + json.dumps({"outcomes": outcomes, "lost_releases": lost_releases}))


async def warm_up(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execute(sa.text("SELECT 1"))


def work(backend_name: str, worker: int, table: str, resource: str, ttl: float, path: str) -> int:
    try:
        run(backend_name, worker, table, resource, ttl, Parent(path))
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    backend_name, workers, table, resource, ttl, path = sys.argv[1:7]
    fork(int(workers), lambda i: work(backend_name, i, table, resource, float(ttl), path))


if __name__ == "__main__":
    main()
