"""Jepsen-style safety test: OS processes, one lock, a fenced register, SIGSTOP.

Eight worker processes (``safety_worker.py``) increment one PostgreSQL row
under one lock, each write fenced with the lease's token. The parent pauses
holders with SIGSTOP for longer than the lease TTL, at two points: right after
the lock was granted (the lease lapses, another worker takes over and writes
with a higher token, so the paused worker's late write must be rejected), and
after the register was read ``FOR UPDATE`` (the others queue on the row; no
increment may be lost). Every attempt is logged in the transaction of its
write, while the row is locked, so the log is the exact commit order, and the
test replays it: each write accepted if and only if its token was not older than the last
accepted one, each read saw the latest value, and the workers' own records
agree with the log.

The sync shells run the same test (``sync_safety_worker.py``: ``SyncLock`` from each
worker's main thread), shorter: one pause, after the grant.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.lock.safety_harness import (
    PAUSE,
    PAUSES,
    Crowd,
    Worker,
    drop_redis_keys,
    service_urls,
    spawn,
)
from tests.lock.safety_worker import tables
from tests.lock.sync_safety_worker import SYNC_BACKENDS

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

WORKERS = 8
TTL = 0.6
#: Where each pause lands: after the grant ("held") or after the read ("read").
SCHEDULE = ("held", "read", "held", "held", "read", "held")
#: The sync shells' runs, kept short: one pause, after the grant (the lease runs out).
SYNC_SCHEDULE = ("held",)
#: Sections begun (by anyone) between two pauses, and by each worker after the last one.
GAP, TAIL = 6, 2
BUDGET = 150.0


@dataclass
class Run(Crowd):
    """The parent's side: answers the workers, pauses them, decides when they stop."""

    pause: float = PAUSE
    todo: list[str] = field(default_factory=lambda: list(SCHEDULE))
    begun: int = 0
    next_at: int = GAP
    pausing: bool = False
    stopping: bool = False
    paused: list[tuple[int, int, str]] = field(default_factory=list)

    async def reply(self, w: Worker, checkpoint: str, fence: int, answer: str) -> None:
        due = self.todo and self.todo[0] == checkpoint and self.begun >= self.next_at
        if self.pausing or not due:
            return await w.answer(answer)
        self.pausing = True
        self.todo.pop(0)
        os.kill(w.pid, signal.SIGSTOP)
        # The answer waits in the socket: the worker stops before it runs another line.
        await w.answer(answer)
        await asyncio.sleep(self.pause)
        os.kill(w.pid, signal.SIGCONT)
        self.paused.append((w.index, fence, checkpoint))
        self.next_at = self.begun + GAP
        for other in self.workers.values():
            other.since_pause = 0
        self.pausing = False
        return None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        w = await self.join(reader, writer)
        while line := await reader.readline():
            kind, _, arg = line.decode().strip().partition(" ")
            if kind == "held":
                self.begun += 1
                w.since_pause += 1
                if not self.todo and not self.pausing:
                    self.stopping |= all(o.since_pause >= TAIL for o in self.workers.values())
                await self.reply(w, "held", int(arg), "last" if self.stopping else "go")
            elif kind == "read":
                await self.reply(w, "read", int(arg), "go")
            else:
                assert kind == "done", line
                w.result = json.loads(arg)
        writer.close()


async def run_workers(
    backend: str, urls: dict[str, str], table: str, resource: str, log: Path
) -> Run:
    server = backend.removeprefix("sync-")
    schedule = SYNC_SCHEDULE if backend in SYNC_BACKENDS else SCHEDULE
    run = Run(WORKERS, pause=PAUSES.get(server, PAUSE), todo=list(schedule))
    module = (
        "tests.lock.sync_safety_worker" if backend in SYNC_BACKENDS else "tests.lock.safety_worker"
    )
    args = [backend, str(WORKERS), table, resource, str(TTL)]
    await spawn(
        module, args, urls, log, run.serve, run, BUDGET, lambda: f"paused {run.paused}",
    )  # fmt: skip
    assert len(run.paused) == len(schedule), run.paused
    return run


@pytest.mark.parametrize(
    "backend",
    [
        "redis",
        "postgres",
        "etcd",
        "zookeeper",
        pytest.param("mysql", marks=pytest.mark.mysql),
        *(
            pytest.param(name, marks=pytest.mark.mysql) if name == "sync-mysql" else name
            for name in SYNC_BACKENDS
        ),
    ],
)
async def test_paused_holders_cannot_corrupt_the_register(
    backend: str,
    redis_url: str,
    postgres_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    table = f"hw_safety_{uuid.uuid4().hex[:12]}"
    metadata, register, log = tables(table)
    engine = create_async_engine(postgres_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(sa.insert(register).values(id=1, value=0, fence=0))
    resource = f"safety-{uuid.uuid4().hex}"
    try:
        urls = service_urls(backend.removeprefix("sync-"), redis_url, postgres_url, request)
        run = await run_workers(backend, urls, table, resource, tmp_path / "workers.err")
        async with engine.connect() as conn:
            history = (await conn.execute(sa.select(log).order_by(log.c.seq))).all()
            final = (await conn.execute(sa.select(register.c.value, register.c.fence))).one()
    finally:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)
        await engine.dispose()
        await drop_redis_keys(redis_url, resource)

    paused = run.paused
    results = {w.index: w.result for w in run.workers.values() if w.result is not None}
    assert sorted(results) == list(range(WORKERS))

    # Replay the commit order: a write is accepted iff its token is not older than
    # the last accepted one; every read saw the value the last accepted write left.
    value, top = 0, 0
    accepted_fences = []
    for row in history:
        assert row.value_before == value, f"lost increment at seq {row.seq}"
        assert row.accepted == (row.fence >= top), f"fencing wrong at seq {row.seq}"
        if row.accepted:
            value, top = value + 1, row.fence
            accepted_fences.append(row.fence)
    assert tuple(final) == (value, top)
    # No stale write accepted: tokens strictly increase along accepted writes.
    assert all(a < b for a, b in itertools.pairwise(accepted_fences))

    # The workers' own records agree with the log, write for write.
    recorded = collections.Counter(
        (i, fence, ok) for i, r in results.items() for fence, ok in r["outcomes"]
    )
    logged = collections.Counter((row.worker, row.fence, row.accepted) for row in history)
    assert recorded == logged
    assert value == sum(ok for _, _, ok in recorded.elements())
    # Every process made progress.
    assert all(any(ok for _, ok in r["outcomes"]) for r in results.values())

    # Holders paused right after the grant came back to a newer token: rejected.
    rejected = {(row.worker, row.fence) for row in history if not row.accepted}
    late = [(i, fence) for i, fence, where in paused if where == "held"]
    assert late
    assert all(attempt in rejected for attempt in late), (late, rejected)
    # Each paused holder's lease had lapsed: its release was refused.
    lost = sum(r["lost_releases"] for r in results.values())
    assert lost >= len(paused)
    print(f"{backend}: {len(history)} attempts, {len(history) - value} rejected, pauses {paused}")
