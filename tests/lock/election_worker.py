"""The candidates of the election fleet test (``test_election_fleet.py``), each its own
OS process.

``main`` imports everything once, then forks the candidates (as ``safety_worker``
does). Each one connects to the parent's Unix socket, says ``ready INDEX PID``, is
answered ``start``, and campaigns on one ``Election`` until SIGTERM. As leader it:

- records its term in PostgreSQL (``terms``: term, worker, ``started``, later ``ended``
  and how it ended), ``started``/``ended`` being ``time.monotonic()`` (one clock for
  every process of the machine) where its block began and where its code stopped;
- asks the parent ``leading TERM STARTED`` and blocks for the answer, so the parent can
  SIGSTOP it exactly there;
- then every ``TICK`` s writes the register with ``fenced_update`` (its term as the
  fence), logging each attempt in the same transaction (``ticks``), and tells the
  parent ``ticked TERM`` after its first write.

A lost lease (``LockLost``) is told to the parent (``lost TERM``) and the candidate
campaigns again. SIGTERM resigns (or stops waiting); the candidate then sends ``done``.

Usage: python -m tests.lock.election_worker BACKEND CANDIDATES TABLE RESOURCE NAMESPACE
TTL SOCKET, with HEADWAY_TEST_REDIS_URL / HEADWAY_TEST_DATABASE_URL (and
HEADWAY_TEST_ETCD_URL or HEADWAY_TEST_ZOOKEEPER_HOSTS) in the environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

import sqlalchemy as sa
from redis import asyncio as aioredis
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from headway import Election, Leadership, LockLost, ZooKeeperLockBackend
from headway.lock.fencing import fenced_update
from tests.lock.safety_worker import Close, Parent, fork, make_backend, register_table

TICK = 0.1


def tables(name: str) -> tuple[sa.MetaData, sa.Table, sa.Table, sa.Table]:
    """The register (one row), the terms and every write attempt, in commit order."""
    metadata = sa.MetaData()
    register = register_table(metadata, name)
    terms = sa.Table(
        f"{name}_terms",
        metadata,
        sa.Column("term", sa.BigInteger, primary_key=True),
        sa.Column("worker", sa.Integer, nullable=False),
        sa.Column("started", sa.Float, nullable=False),
        sa.Column("ended", sa.Float),
        sa.Column("how", sa.String(16)),
    )
    ticks = sa.Table(
        f"{name}_ticks",
        metadata,
        sa.Column("seq", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("worker", sa.Integer, nullable=False),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("accepted", sa.Boolean, nullable=False),
    )
    return metadata, register, terms, ticks


def backend_for(name: str, engine: AsyncEngine, client: aioredis.Redis, namespace: str, ttl: float
) -> tuple[Any, Close]:  # fmt: skip
    if name == "zookeeper":
        # The lease is the session: a session as long as the TTL ends with a pause past it.
        zk = ZooKeeperLockBackend(
            os.environ["HEADWAY_TEST_ZOOKEEPER_HOSTS"], session_timeout=ttl, prefix=namespace
        )
        return zk, zk.aclose
    return make_backend(name, engine, client, namespace)


class Candidate:
    """One process's campaign loop and its records."""

    def __init__(self, worker: int, engine: AsyncEngine, table: str, parent: Parent) -> None:
        self.worker = worker
        self.engine = engine
        _, self.register, self.terms, self.ticks = tables(table)
        self.parent = parent
        self.current: Leadership | None = None
        self.stopping = asyncio.Event()
        self.led: list[int] = []
        self.lost: list[int] = []

    async def campaign(self, election: Election) -> None:
        while not self.stopping.is_set():
            ended: list[float] = []
            try:
                async with election.campaign() as term:
                    self.current = term
                    if self.stopping.is_set():
                        # SIGTERM came as the lock was granted: a cancelled acquire can
                        # still return it (on Redis, unsubscribing from the wake-ups
                        # can swallow the cancellation).
                        term.resign()
                    started = time.monotonic()
                    try:
                        await self.lead(term, started)
                    finally:
                        ended.append(time.monotonic())  # its code stopped here
                how = "resigned"
            except LockLost:
                how = "lost"
            finally:
                self.current = None
            await self.record_end(term.term, ended[0], how)
            if how == "lost":
                self.lost.append(term.term)
                self.parent.tell(f"lost {term.term}")

    async def lead(self, term: Leadership, started: float) -> None:
        self.led.append(term.term)
        row = {"term": term.term, "worker": self.worker, "started": started}
        await asyncio.shield(self.write(sa.insert(self.terms).values(**row)))
        self.parent.ask(f"leading {term.term} {started}")  # the parent may SIGSTOP us here
        first = True
        while True:
            # Shielded: a cancelled block leaves the attempt whole (and logged).
            accepted = await asyncio.shield(self.tick(term.term, term.lease.fence))
            if first and accepted:
                first = False
                self.parent.tell(f"ticked {term.term}")
            await asyncio.sleep(TICK)

    async def tick(self, term: int, fence: int) -> bool:
        at = time.monotonic()
        async with self.engine.begin() as conn:
            # FOR UPDATE: the log's order is the register's commit order.
            query = sa.select(self.register.c.id).where(self.register.c.id == 1)
            await conn.execute(query.with_for_update())
            accepted = await fenced_update(
                conn, self.register, {"id": 1}, {"value": self.worker}, fence=fence
            )
            values = {"worker": self.worker, "term": term, "at": at, "accepted": accepted}
            await conn.execute(sa.insert(self.ticks).values(**values))
        return accepted

    async def write(self, statement: sa.Executable) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(statement)

    async def record_end(self, term: int, ended: float, how: str) -> None:
        where = self.terms.c.term == term
        await self.write(sa.update(self.terms).where(where).values(ended=ended, how=how))

    def stop(self, task: asyncio.Task[None]) -> None:
        """SIGTERM: a leader resigns (its block ends quietly); a waiter stops waiting."""
        self.stopping.set()
        if self.current is not None:
            self.current.resign()
        else:
            task.cancel()


async def run(args: list[str], worker: int, parent: Parent) -> None:
    backend_name, table, resource, namespace, ttl = args[0], args[2], args[3], args[4], args[5]
    engine = create_async_engine(os.environ["HEADWAY_TEST_DATABASE_URL"], pool_size=4)
    client = aioredis.Redis.from_url(os.environ["HEADWAY_TEST_REDIS_URL"])
    backend, close = backend_for(backend_name, engine, client, namespace, float(ttl))
    candidate = Candidate(worker, engine, table, parent)
    election = Election(backend, resource, identity=f"w{worker}", ttl=float(ttl))
    try:
        async with engine.connect() as conn:  # warm the pool and the scripts up
            await conn.execute(sa.text("SELECT 1"))
        await backend.release(await backend.acquire(f"{resource}-warmup-{worker}", 2, 5))
        assert parent.ask(f"ready {worker} {os.getpid()}") == "start"
        task = asyncio.create_task(candidate.campaign(election))
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, candidate.stop, task)
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await close()
        await client.aclose()
        await engine.dispose()
    parent.tell("done " + json.dumps({"led": candidate.led, "lost": candidate.lost}))


def work(args: list[str], worker: int, path: str) -> int:
    try:
        asyncio.run(run(args, worker, Parent(path)))
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    args, path = sys.argv[1:7], sys.argv[7]
    fork(int(args[1]), lambda i: work(args, i, path), killed=1)


if __name__ == "__main__":
    main()
