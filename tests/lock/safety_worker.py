"""The clients of the safety test (``test_safety.py``), each its own OS process.

``main`` imports everything once, then forks the workers: much cheaper than
eight interpreters each importing SQLAlchemy, asyncpg and redis. Each worker
connects to the parent's Unix socket and loops over critical sections on one
lock: acquire, read the shared register ``FOR UPDATE``, write value + 1 with
``fenced_update``, log the attempt in the same transaction, release. At two
checkpoints (lock held; register read) it tells the parent and blocks until
the parent answers, so the parent can SIGSTOP it exactly there. The answer
``last`` makes the current section its last. At the end it sends ``done`` and
every (fence, accepted).

Usage: python -m tests.lock.safety_worker BACKEND WORKERS TABLE RESOURCE TTL SOCKET
with HEADWAY_TEST_REDIS_URL / HEADWAY_TEST_DATABASE_URL (and, for zookeeper,
HEADWAY_TEST_ZOOKEEPER_HOSTS; for mysql, HEADWAY_TEST_MYSQL_URL) in the environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from redis import asyncio as aioredis
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from headway import (
    EtcdLockBackend,
    Lock,
    LockNotOwned,
    RedisLockBackend,
    ZooKeeperLockBackend,
)
from headway.lock.backends.mysql import MySQLLockBackend
from headway.lock.backends.postgres import PostgresLockBackend
from headway.lock.fencing import fenced_update

#: The ZooKeeper session timeout (s): at least the TTL, well under test_safety's PAUSE.
ZK_SESSION = 1.0


def register_table(metadata: sa.MetaData, name: str) -> sa.Table:
    """The fenced register: one row (``id`` 1), its ``value`` and the ``fence`` that wrote it."""
    return sa.Table(
        name,
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("value", sa.Integer, nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
    )


def tables(name: str) -> tuple[sa.MetaData, sa.Table, sa.Table]:
    """The register (one row) and the log of every attempt, in commit order (``seq``)."""
    metadata = sa.MetaData()
    register = register_table(metadata, name)
    log = sa.Table(
        f"{name}_log",
        metadata,
        sa.Column("seq", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("worker", sa.Integer, nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("accepted", sa.Boolean, nullable=False),
        sa.Column("value_before", sa.Integer, nullable=False),
    )
    return metadata, register, log


class Parent:
    """The line channel to the parent; ``ask`` blocks the whole process, on purpose."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.file = self.sock.makefile("rw", encoding="utf-8", newline="\n")

    def tell(self, message: str) -> None:
        self.file.write(message + "\n")
        self.file.flush()

    def ask(self, message: str) -> str:
        self.tell(message)
        answer = self.file.readline().strip()
        if not answer:
            raise SystemExit("parent went away")
        return answer


Close = Callable[[], Awaitable[None]]


def make_backend(
    name: str, engine: AsyncEngine, client: aioredis.Redis, namespace: str | None = None
) -> tuple[Any, Close]:
    """The backend ``name`` over the environment's servers, and how to close it.

    ``namespace``: etcd keys of its own on the shared server (ZooKeeper's is the test's).
    """
    if name == "redis":
        redis_backend = RedisLockBackend(client)
        return redis_backend, redis_backend.aclose
    if name == "etcd":
        url = os.environ["HEADWAY_TEST_ETCD_URL"]
        etcd = EtcdLockBackend(url, namespace=namespace) if namespace else EtcdLockBackend(url)
        return etcd, etcd.aclose
    if name == "zookeeper":
        # A session of a second on a server with 100 ms ticks: the lease ttl fits in it,
        # and a pause past it ends the session (test_safety's PAUSE).
        zk = ZooKeeperLockBackend(
            os.environ["HEADWAY_TEST_ZOOKEEPER_HOSTS"], session_timeout=ZK_SESSION
        )
        return zk, zk.aclose
    if name == "mysql":
        mysql_engine = create_async_engine(os.environ["HEADWAY_TEST_MYSQL_URL"], pool_size=3)
        mysql = MySQLLockBackend(mysql_engine)

        async def close() -> None:
            await mysql.aclose()
            await mysql_engine.dispose()

        return mysql, close
    assert name == "postgres", name
    postgres = PostgresLockBackend(engine)
    return postgres, postgres.aclose


async def section(engine: AsyncEngine, table: str, worker: int, fence: int, parent: Parent) -> bool:
    """Increment the register with ``fence`` and log the attempt; True if it was accepted."""
    _, register, log = tables(table)
    async with engine.begin() as conn:
        # FOR UPDATE: the read and the write are one step, so a stale holder
        # cannot read before a newer holder writes and then write after it.
        query = sa.select(register.c.value).where(register.c.id == 1).with_for_update()
        value = (await conn.execute(query)).scalar_one()
        parent.ask(f"read {fence}")
        accepted = await fenced_update(conn, register, {"id": 1}, {"value": value + 1}, fence=fence)
        await conn.execute(
            sa.insert(log).values(worker=worker, fence=fence, accepted=accepted, value_before=value)
        )
    return accepted


async def run(
    backend_name: str, worker: int, table: str, resource: str, ttl: float, parent: Parent
) -> None:
    engine = create_async_engine(os.environ["HEADWAY_TEST_DATABASE_URL"], pool_size=3)
    client = aioredis.Redis.from_url(os.environ["HEADWAY_TEST_REDIS_URL"])
    backend, close = make_backend(backend_name, engine, client)
    lock = Lock(backend, resource, ttl=ttl, timeout=60)
    outcomes: list[tuple[int, bool]] = []
    lost_releases = 0
    try:
        # Warm the pool and the scripts up before the start line.
        async with engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))
        await backend.release(await backend.acquire(f"{resource}-warmup-{worker}", ttl, 5))
        parent.ask(f"ready {worker} {os.getpid()}")
        while True:
            lease = await lock.acquire()
            last = parent.ask(f"held {lease.fence}") == "last"
            accepted = await section(engine, table, worker, lease.fence, parent)
            outcomes.append((lease.fence, accepted))
            try:
                await lock.release(lease)
            except LockNotOwned:
                lost_releases += 1
            if last:
                break
    finally:
        await close()
        await client.aclose()
        await engine.dispose()
    parent.tell("done " + json.dumps({"outcomes": outcomes, "lost_releases": lost_releases}))


def work(backend_name: str, worker: int, table: str, resource: str, ttl: float, path: str) -> int:
    try:
        asyncio.run(run(backend_name, worker, table, resource, ttl, Parent(path)))
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def fork(workers: int, work: Callable[[int], int], killed: int = 0) -> None:
    """Run ``work(i)`` for each worker ``i`` in a child process; exit 1 if any failed
    (other than the ``killed`` ones the test SIGKILLs on purpose)."""
    # Load the dialect (imported lazily, on first use) once, before forking.
    create_async_engine(os.environ["HEADWAY_TEST_DATABASE_URL"])
    if "HEADWAY_TEST_MYSQL_URL" in os.environ:
        create_async_engine(os.environ["HEADWAY_TEST_MYSQL_URL"])
    pids = []
    for worker in range(workers):
        # Fork before any event loop or thread exists: each child builds its own clients.
        pid = os.fork()
        if pid == 0:
            code = work(worker)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    ok = codes.count(-signal.SIGKILL) == killed and codes.count(0) == workers - killed
    sys.exit(0 if ok else 1)


def main() -> None:
    backend_name, workers, table, resource, ttl, path = sys.argv[1:7]
    fork(int(workers), lambda i: work(backend_name, i, table, resource, float(ttl), path))


if __name__ == "__main__":
    main()
