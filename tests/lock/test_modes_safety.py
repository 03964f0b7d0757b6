"""Jepsen-style safety of the lock modes: OS processes, one name, a fenced register, SIGSTOP.

Six worker processes (``modes_safety_worker.py``) loop over critical sections on
one name, through a ``ReadWriteLock`` (a third of the sections write) or a
``Semaphore``. Each holder records itself in a PostgreSQL table of holders on
entry (logging who it found there) and leaves it on exit; writers increment a
register with ``fenced_update``, readers log the value and the fence they read.
Every step is logged while the register's row is locked, so the log is the exact
order of the steps, and the test replays it.

The parent SIGSTOPs holders past their TTL, right after the grant ("held") or
inside the section ("inside"). A read-write pause lasts until a writer queued
behind the paused holder has written (which it can only do once the paused lease
has lapsed); a permit's lasts ``PAUSE``. Leases that lapsed are known exactly:
their release was refused. The replay checks that no two holders whose leases
held overlapped unless the modes allow it (readers with readers; at most N
permits), that no stale write was accepted and no stale read passed for fresh,
and that every paused holder's lease lapsed and was caught where it should be.
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
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.lock.modes_safety_worker import tables
from tests.lock.safety_harness import (
    PAUSE,
    PAUSES,
    Crowd,
    Worker,
    drop_redis_keys,
    service_urls,
    spawn,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

WORKERS = 6
PERMITS = 3
TTL = 0.6
#: (checkpoint, kind) of each pause, in order.
RW_PAUSES = (("held", "write"), ("inside", "read"), ("held", "read"), ("inside", "write"))
PERMIT_PAUSES = (("inside", "permit"), ("held", "permit"))
#: Sections begun (by anyone) between two pauses, and by each worker after the last one.
GAP, TAIL = 6, 2
BUDGET = 120.0
#: The backends that offer the modes (``ModalLockBackend``); a new one is one entry here.
BACKENDS = ["redis", "postgres", "etcd", "zookeeper"]

Key = tuple[int, int]  # (worker, fence): one lease


@dataclass
class Run(Crowd):
    """The parent's side: answers the workers, pauses them, decides when they stop."""

    todo: list[tuple[str, str]] = field(default_factory=list)
    pause: float = PAUSE
    #: Semaphore: hold the first holders inside until this many are in at once.
    gate: int = 0
    gated: list[Worker] = field(default_factory=list)
    begun: int = 0
    next_at: int = GAP
    pausing: bool = False
    stopping: bool = False
    paused: list[tuple[int, int, str, str]] = field(default_factory=list)
    top: int = 0  # the fence of the newest accepted write
    wrote: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def resume_when(self, kind: str, fence: int) -> None:
        if kind == "permit":
            await asyncio.sleep(self.pause)  # other permits let others in: only time tells
            return
        # A write queued behind the paused lease: it lapsed, someone else wrote.
        async with self.wrote:
            await self.wrote.wait_for(lambda: self.top > fence)

    async def reply(self, w: Worker, where: str, kind: str, fence: int, answer: str) -> None:
        due = self.todo and self.todo[0] == (where, kind) and self.begun >= self.next_at
        # Someone else each time: the one just resumed is the first to ask again.
        if self.pausing or not due or (self.paused and self.paused[-1][0] == w.index):
            return await w.answer(answer)
        self.pausing = True
        self.todo.pop(0)
        os.kill(w.pid, signal.SIGSTOP)
        # The answer waits in the socket: the worker stops before it runs another line.
        await w.answer(answer)
        await self.resume_when(kind, fence)
        os.kill(w.pid, signal.SIGCONT)
        self.paused.append((w.index, fence, where, kind))
        self.next_at = self.begun + GAP
        for other in self.workers.values():
            other.since_pause = 0
        self.pausing = False
        return None

    async def inside(self, w: Worker, kind: str, fence: int) -> None:
        if len(self.gated) < self.gate:
            self.gated.append(w)
            if len(self.gated) == self.gate:  # all in at once: let them go
                for gated in self.gated:
                    await gated.answer("go")
            return
        await self.reply(w, "inside", kind, fence, "go")

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        w = await self.join(reader, writer)
        while line := await reader.readline():
            what, *args = line.decode().split()
            if what == "held":
                self.begun += 1
                w.since_pause += 1
                if not self.todo and not self.pausing:
                    self.stopping |= all(o.since_pause >= TAIL for o in self.workers.values())
                answer = "last" if self.stopping else "go"
                await self.reply(w, "held", args[0], int(args[1]), answer)
            elif what == "inside":
                await self.inside(w, args[0], int(args[1]))
            elif what == "wrote":
                if args[1] == "1":
                    async with self.wrote:
                        self.top = max(self.top, int(args[0]))
                        self.wrote.notify_all()
            else:
                assert what == "done", line
                w.result = {}
        writer.close()


@dataclass
class Replay:
    """The log replayed: holders inside at each entry, the register, the lapsed leases."""

    rows: list[Any]
    lapsed: set[Key] = field(default_factory=set)
    #: (entering lease, its kind, the leases inside then with their kinds)
    entries: list[tuple[Key, str, dict[Key, str]]] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)  # fences of accepted writes

    def __post_init__(self) -> None:
        released = {(r.worker, r.fence): r.accepted for r in self.rows if r.event == "release"}
        self.lapsed = {key for key, ok in released.items() if not ok}
        entered = [(r.worker, r.fence) for r in self.rows if r.event == "enter"]
        assert sorted(entered) == sorted(released), "a section was not logged whole"
        inside: dict[Key, str] = {}
        value = top = 0
        for row in self.rows:
            key = (row.worker, row.fence)
            if row.event == "enter":
                # The holder's own view, taken under the row lock, agrees with the replay.
                assert sorted(map(tuple, json.loads(row.others))) == sorted(inside), row
                self.entries.append((key, row.kind, dict(inside)))
                inside[key] = row.kind
            elif row.event == "exit":
                del inside[key]
            elif row.event == "write":
                assert row.value == value, f"lost increment at seq {row.seq}"
                assert row.accepted == (row.fence >= top), f"fencing wrong at seq {row.seq}"
                if row.accepted:
                    value, top = value + 1, row.fence
                    self.accepted.append(row.fence)
            elif row.event == "read":
                assert (row.value, row.seen_fence) == (value, top), f"bad read at seq {row.seq}"

    def live(self, leases: dict[Key, str]) -> dict[Key, str]:
        return {key: kind for key, kind in leases.items() if key not in self.lapsed}


async def run_workers(
    backend: str, mode: str, urls: dict[str, str], table: str, resource: str, log: Path
) -> Run:
    pauses = RW_PAUSES if mode == "rw" else PERMIT_PAUSES
    run = Run(WORKERS, todo=list(pauses), pause=PAUSES.get(backend, PAUSE))
    if mode != "rw":
        run.gate = PERMITS
    args = [backend, str(WORKERS), mode, table, resource, str(TTL)]
    await spawn(
        "tests.lock.modes_safety_worker", args, urls, log, run.serve, run, BUDGET,
        lambda: f"paused {run.paused}, to do {run.todo}, gated {len(run.gated)}",
    )  # fmt: skip
    assert len(run.paused) == len(pauses), run.paused
    assert sorted(w.index for w in run.workers.values() if w.result is not None) == list(
        range(WORKERS)
    )
    return run


async def replayed(
    backend: str,
    mode: str,
    redis_url: str,
    postgres_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> tuple[Run, Replay]:
    """Run the workers in ``mode`` over ``backend``; the run and its replayed log."""
    table = f"hw_modes_{uuid.uuid4().hex[:12]}"
    metadata, register, _, log = tables(table)
    engine = create_async_engine(postgres_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(sa.insert(register).values(id=1, value=0, fence=0))
    resource = f"modes-safety-{uuid.uuid4().hex}"
    try:
        urls = service_urls(backend, redis_url, postgres_url, request)
        run = await run_workers(backend, mode, urls, table, resource, tmp_path / "workers.err")
        async with engine.connect() as conn:
            rows = (await conn.execute(sa.select(log).order_by(log.c.seq))).all()
    finally:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)
        await engine.dispose()
        await drop_redis_keys(redis_url, resource)
    return run, Replay(list(rows))


@pytest.mark.parametrize("backend", BACKENDS)
async def test_paused_readers_and_writers_cannot_break_the_read_write_lock(
    backend: str,
    redis_url: str,
    postgres_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    run, replay = await replayed(backend, "rw", redis_url, postgres_url, tmp_path, request)
    rows, lapsed = replay.rows, replay.lapsed

    # No overlap the modes forbid, unless one of the two leases had lapsed.
    overlaps = [
        (key, other)
        for key, kind, inside in replay.entries
        for other, other_kind in inside.items()
        if "write" in (kind, other_kind)
    ]
    assert [o for o in overlaps if not lapsed & set(o)] == []
    # No stale write accepted: fences strictly increase along accepted writes, and only
    # lapsed writers were refused; only lapsed readers read a newer writer's value.
    assert all(a < b for a, b in itertools.pairwise(replay.accepted))
    refused = {(r.worker, r.fence) for r in rows if r.event == "write" and not r.accepted}
    stale_reads = {
        (r.worker, r.fence) for r in rows if r.event == "read" and r.seen_fence > r.fence
    }
    assert refused <= lapsed
    assert stale_reads <= lapsed
    fences = [r.fence for r in rows if r.event == "enter"]
    assert len(fences) == len(set(fences)), "a fence was granted twice"

    # Each paused holder's lease lapsed, a writer behind it wrote, and it was caught:
    # its write refused, its read stale, or (paused inside) a writer entered beside it.
    for worker, fence, where, kind in run.paused:
        key = (worker, fence)
        assert key in lapsed, (key, where, kind)
        if (where, kind) == ("held", "write"):
            assert key in refused
        elif (where, kind) == ("held", "read"):
            assert key in stale_reads
        else:
            assert any(key in pair for pair in overlaps), (key, where, kind)
    # Every worker made progress, and the readers and the writers did.
    done = {(r.worker, r.kind) for r in rows if r.event == "release" and r.accepted}
    assert {w for w, _ in done} == set(range(WORKERS))
    assert {k for _, k in done} == {"read", "write"}
    most_readers = max(
        1 + len(replay.live(inside)) for key, kind, inside in replay.entries if kind == "read"
    )
    print(
        f"{backend}: {len(fences)} sections, {len(replay.accepted)} writes accepted, "
        f"{len(refused)} refused, {len(stale_reads)} stale reads, {len(lapsed)} lapsed, "
        f"up to {most_readers} readers at once; paused {run.paused}"
    )


@pytest.mark.parametrize("backend", BACKENDS)
async def test_never_more_than_n_permits_and_n_are_reached(
    backend: str,
    redis_url: str,
    postgres_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    mode = f"permits:{PERMITS}"
    run, replay = await replayed(backend, mode, redis_url, postgres_url, tmp_path, request)

    # At every entry, the holders inside whose leases held (the entrant too, unless its
    # own lapsed) were at most PERMITS; and PERMITS were inside at once under demand.
    at_once = [len(replay.live({**inside, key: kind})) for key, kind, inside in replay.entries]
    assert max(at_once) == PERMITS, collections.Counter(at_once)
    fences = [key[1] for key, _, _ in replay.entries]
    assert len(fences) == len(set(fences)), "a fence was granted twice"
    for worker, fence, where, kind in run.paused:
        assert (worker, fence) in replay.lapsed, (worker, fence, where, kind)
    done = {r.worker for r in replay.rows if r.event == "release" and r.accepted}
    assert done == set(range(WORKERS))
    print(
        f"{backend}: {len(fences)} sections, {len(replay.lapsed)} lapsed, "
        f"holders at once {sorted(collections.Counter(at_once).items())}; paused {run.paused}"
    )
