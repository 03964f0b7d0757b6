"""The clients of the modes safety test (``test_modes_safety.py``), each its own OS process.

Each worker loops over sections on one name, through a ``ReadWriteLock`` (``rw``:
worker ``i`` writes in its round ``r`` if ``(i + r) % 3 == 0``, else reads) or a
``Semaphore`` (``permits:N``). A section: acquire; ask ``held KIND FENCE``; enter
(insert itself into the table of holders and log the holders it found there);
ask ``inside KIND FENCE COUNT``; a writer increments the register with
``fenced_update`` (and tells ``wrote FENCE ACCEPTED``), a reader logs the value and
the fence it read; exit (delete itself, log it); release, and log whether the
release was accepted (refused: the lease had lapsed). Every step locks the
register's row ``FOR UPDATE`` before it logs, so the log's ``seq`` is the exact
order of the steps. The parent SIGSTOPs workers at the two asks, as in
``safety_worker``, whose ``Parent``, ``make_backend`` and ``fork`` this reuses.

Usage: python -m tests.lock.modes_safety_worker BACKEND WORKERS KIND TABLE RESOURCE TTL SOCKET
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import traceback
from typing import Any

import sqlalchemy as sa
from redis import asyncio as aioredis
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from headway import Lock, LockNotOwned
from headway.lock.fencing import fenced_update
from headway.lock.shared import ReadWriteLock, Semaphore
from tests.lock.safety_worker import Parent, fork, make_backend, register_table


def tables(name: str) -> tuple[sa.MetaData, sa.Table, sa.Table, sa.Table]:
    """The register (one row), the holders inside, and the log of every step (``seq``)."""
    metadata = sa.MetaData()
    register = register_table(metadata, name)
    inside = sa.Table(
        f"{name}_inside",
        metadata,
        sa.Column("worker", sa.Integer, primary_key=True),
        sa.Column("fence", sa.BigInteger, nullable=False),
    )
    log = sa.Table(
        f"{name}_log",
        metadata,
        sa.Column("seq", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("worker", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),  # read, write, permit
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("event", sa.String(8), nullable=False),  # enter, write, read, exit, release
        sa.Column("accepted", sa.Boolean),  # write: by the fence; release: by the backend
        sa.Column("value", sa.Integer),  # write: the value before; read: the value read
        sa.Column("seen_fence", sa.BigInteger),  # read: the register's fence
        sa.Column("others", sa.Text),  # enter: [[worker, fence], ...] already inside
    )
    return metadata, register, inside, log


class Recorder:
    """One worker's steps, each logged while the register's row is locked."""

    def __init__(self, engine: AsyncEngine, table: str, worker: int) -> None:
        _, self.register, self.inside, self.log = tables(table)
        self.engine, self.worker = engine, worker

    async def _locked(self, conn: AsyncConnection) -> tuple[int, int]:
        query = sa.select(self.register.c.value, self.register.c.fence).where(
            self.register.c.id == 1
        )
        value, fence = (await conn.execute(query.with_for_update())).one()
        return value, fence

    async def _log(self, conn: AsyncConnection, kind: str, fence: int, **row: Any) -> None:
        await conn.execute(
            sa.insert(self.log).values(worker=self.worker, kind=kind, fence=fence, **row)
        )

    async def enter(self, kind: str, fence: int) -> int:
        """Join the holders; return how many are inside now (this one too)."""
        async with self.engine.begin() as conn:
            await self._locked(conn)
            found = (await conn.execute(sa.select(self.inside.c.worker, self.inside.c.fence))).all()
            others = sorted([w, f] for w, f in found)
            await conn.execute(sa.insert(self.inside).values(worker=self.worker, fence=fence))
            await self._log(conn, kind, fence, event="enter", others=json.dumps(others))
        return len(others) + 1

    async def write(self, fence: int) -> bool:
        async with self.engine.begin() as conn:
            value, _ = await self._locked(conn)
            accepted = await fenced_update(
                conn, self.register, {"id": 1}, {"value": value + 1}, fence=fence
            )
            await self._log(conn, "write", fence, event="write", accepted=accepted, value=value)
        return accepted

    async def read(self, fence: int) -> None:
        async with self.engine.begin() as conn:
            value, seen = await self._locked(conn)
            await self._log(conn, "read", fence, event="read", value=value, seen_fence=seen)

    async def exit(self, kind: str, fence: int) -> None:
        async with self.engine.begin() as conn:
            await self._locked(conn)
            await conn.execute(sa.delete(self.inside).where(self.inside.c.worker == self.worker))
            await self._log(conn, kind, fence, event="exit")

    async def released(self, kind: str, fence: int, accepted: bool) -> None:
        async with self.engine.begin() as conn:
            await self._locked(conn)
            await self._log(conn, kind, fence, event="release", accepted=accepted)


def locks(backend: Any, mode: str, resource: str, ttl: float) -> dict[str, Lock]:
    """The worker's ``Lock`` per kind: ``read`` and ``write``, or ``permit``."""
    if mode == "rw":
        rw = ReadWriteLock(backend, resource, ttl=ttl, timeout=60)
        return {"read": rw.read, "write": rw.write}
    permits = int(mode.removeprefix("permits:"))
    return {"permit": Semaphore(backend, resource, permits=permits, ttl=ttl, timeout=60)}


async def run(
    backend_name: str, worker: int, mode: str, table: str, resource: str, ttl: float, path: str
) -> None:
    parent = Parent(path)
    engine = create_async_engine(os.environ["HEADWAY_TEST_DATABASE_URL"], pool_size=3)
    client = aioredis.Redis.from_url(os.environ["HEADWAY_TEST_REDIS_URL"])
    backend, close = make_backend(backend_name, engine, client, namespace=f"hw-test/{resource}/")
    recorder = Recorder(engine, table, worker)
    by_kind = locks(backend, mode, resource, ttl)
    try:
        # Warm the pool and the scripts up before the start line.
        async with engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))
        for warm in locks(backend, mode, f"{resource}-warmup-{worker}", ttl).values():
            await warm.release(await warm.acquire(timeout=5))
        parent.ask(f"ready {worker} {os.getpid()}")
        for round_ in itertools.count():
            kind = "permit" if "permit" in by_kind else "read"
            if kind == "read" and (worker + round_) % 3 == 0:
                kind = "write"
            if await section(by_kind[kind], kind, recorder, parent):
                break
    finally:
        await close()
        await client.aclose()
        await engine.dispose()
    parent.tell("done {}")


async def section(lock: Lock, kind: str, recorder: Recorder, parent: Parent) -> bool:
    """One critical section, logged step by step; True if the parent said it is the last."""
    lease = await lock.acquire()
    last = parent.ask(f"held {kind} {lease.fence}") == "last"
    count = await recorder.enter(kind, lease.fence)
    parent.ask(f"inside {kind} {lease.fence} {count}")
    if kind == "write":
        accepted = await recorder.write(lease.fence)
        parent.tell(f"wrote {lease.fence} {int(accepted)}")
    elif kind == "read":
        await recorder.read(lease.fence)
    await recorder.exit(kind, lease.fence)
    try:
        await lock.release(lease)
        released = True
    except LockNotOwned:
        released = False
    await recorder.released(kind, lease.fence, released)
    return last


def work(args: list[str], worker: int) -> int:
    backend_name, mode, table, resource, ttl, path = args
    try:
        asyncio.run(run(backend_name, worker, mode, table, resource, float(ttl), path))
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    backend_name, workers, *args = sys.argv[1:8]
    fork(int(workers), lambda i: work([backend_name, *args], i))


if __name__ == "__main__":
    main()
