"""Leader election with real processes: 4 candidates, a SIGKILLed and a SIGSTOPped leader.

Four OS processes (``election_worker.py``) campaign on one ``Election``. Each leader
records its term and the interval it believed it led in PostgreSQL, and writes a
register fenced with its term every 0.1 s. The parent:

1. SIGKILLs the first leader after its first write: a new leader must be elected within
   the TTL + 1 s, with a higher term;
2. SIGSTOPs that second leader as it reports its term, and resumes it once a third
   leader has written: past its TTL, as the store elected someone else. On resuming it
   tries one more fenced write, which must be rejected, and learns it lost (its block is
   cancelled: ``LockLost``) within ``LEARNS_WITHIN``;
3. SIGTERMs everyone: the leader resigns, the others stop waiting.

The log must show no two leaders at once: each term's interval (from its block's start
to where its code stopped; the SIGKILL for the killed leader; the SIGSTOP for the paused
one, which did nothing while stopped) ends before the next term's begins. That is the
lease-loss bound of docs/locks.md ("Leader election"): a running leader stops by its
lease's deadline, before the store can elect anyone else. ``time.monotonic()`` is one
clock for every process of the machine, so the processes' stamps compare.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.lock.election_worker import tables
from tests.lock.safety_harness import Crowd, Worker, drop_redis_keys, service_urls, spawn

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

CANDIDATES = 4
TTL = 2.0  # etcd's shortest lease
#: How soon after SIGCONT the paused leader's block must have been cancelled.
LEARNS_WITHIN = 0.5
BUDGET = 30.0


@dataclass
class Run(Crowd):
    """The parent's side: answers the candidates, kills the first leader, pauses the second."""

    elected: list[tuple[int, int, float]] = field(default_factory=list)  # worker, term, started
    killed: tuple[int, float] | None = None  # worker, when
    paused: tuple[int, float, float] | None = None  # worker, stopped, resumed
    lost: list[tuple[int, int]] = field(default_factory=list)
    resume: asyncio.Event = field(default_factory=asyncio.Event)
    learned: asyncio.Event = field(default_factory=asyncio.Event)
    pausing: asyncio.Task[None] | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        w = await self.join(reader, writer)
        while line := await reader.readline():
            kind, _, arg = line.decode().strip().partition(" ")
            if kind == "leading":
                term, started = arg.split()
                self.elected.append((w.index, int(term), float(started)))
                if len(self.elected) == 2:
                    self.pausing = asyncio.create_task(self.pause(w))
                else:
                    await w.answer("go")
            elif kind == "ticked" and len(self.elected) == 1:
                os.kill(w.pid, signal.SIGKILL)
                self.killed = (w.index, time.monotonic())
            elif kind == "ticked" and len(self.elected) == 3:
                self.resume.set()  # the third leader has written
            elif kind == "lost":
                self.lost.append((w.index, int(arg)))
                self.learned.set()
            elif kind == "done":
                w.result = json.loads(arg)
            else:
                assert kind == "ticked", line
        writer.close()

    async def pause(self, w: Worker) -> None:
        os.kill(w.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        # The answer waits in the socket: the leader stops before it runs another line.
        await w.answer("go")
        await self.resume.wait()
        self.paused = (w.index, stopped, time.monotonic())
        os.kill(w.pid, signal.SIGCONT)
        # It should learn it lost at once; the checks below say if it did not.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LEARNS_WITHIN + 1):
                await self.learned.wait()
        self.stop_all()

    def stop_all(self) -> None:
        for other in self.workers.values():
            if self.killed is None or other.index != self.killed[0]:
                os.kill(other.pid, signal.SIGTERM)


@pytest.mark.parametrize("backend", ["redis", "etcd", "zookeeper"])
async def test_one_leader_at_a_time_through_a_kill_and_a_pause(
    backend: str,
    redis_url: str,
    postgres_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    table = f"hw_elect_{uuid.uuid4().hex[:12]}"
    metadata, register, terms, ticks = tables(table)
    engine = create_async_engine(postgres_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(sa.insert(register).values(id=1, value=-1, fence=0))
    resource = f"election-{uuid.uuid4().hex}"
    namespace = f"headway-test/{uuid.uuid4().hex}/"
    if backend == "zookeeper":
        namespace = f"/headway-test/{uuid.uuid4().hex}"
    run = Run(CANDIDATES)
    try:
        urls = service_urls(backend, redis_url, postgres_url, request)
        args = [backend, str(CANDIDATES), table, resource, namespace, str(TTL)]
        await spawn(
            "tests.lock.election_worker", args, urls, tmp_path / "candidates.err", run.serve,
            run, BUDGET, lambda: f"elected {run.elected}, killed {run.killed}",
        )  # fmt: skip
        async with engine.connect() as conn:
            led = (await conn.execute(sa.select(terms).order_by(terms.c.started))).all()
            log = (await conn.execute(sa.select(ticks).order_by(ticks.c.seq))).all()
    finally:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)
        await engine.dispose()
        await drop_redis_keys(redis_url, resource)

    assert run.killed is not None
    assert run.paused is not None
    (dead, killed_at), (sleeper, stopped, resumed) = run.killed, run.paused
    first, second, third = run.elected[:3]
    assert (first[0], second[0]) == (dead, sleeper)
    assert [(row.worker, row.term, row.started) for row in led[:3]] == [first, second, third]
    # Terms rise with every leader, in the order they were elected.
    assert all(a.term < b.term for a, b in itertools.pairwise(led))

    # 1. The SIGKILLed leader is replaced within the TTL + 1 s, by a higher term.
    assert second[2] - killed_at <= TTL + 1, f"new leader {second[2] - killed_at:.2f} s after"
    # 2. The paused leader learns it lost soon after it resumes, its late write refused.
    assert run.lost[:1] == [(sleeper, second[1])]
    assert led[1].how == "lost"
    assert 0 <= led[1].ended - resumed <= LEARNS_WITHIN, led[1].ended - resumed
    late = [row for row in log if row.term == second[1] and row.at >= resumed]
    assert late, "the resumed leader wrote nothing"
    assert not any(row.accepted for row in late)
    # 3. At most one leader at every instant: each interval ends before the next begins.
    ends = {first[1]: killed_at, second[1]: stopped}
    for a, b in itertools.pairwise(led):
        end = ends.get(a.term, a.ended)
        assert end is not None
        assert end <= b.started, f"terms {a.term} and {b.term} overlap by {end - b.started:.3f} s"
    assert all(row.how == "resigned" for row in led[2:])
    # Fencing: a write is accepted iff its term is not older than the last accepted one.
    top = 0
    for row in log:
        assert row.accepted == (row.term >= top), f"fencing wrong at seq {row.seq}"
        top = max(top, row.term) if row.accepted else top
    # The survivors' own records match the log.
    results = {w.index: w.result for w in run.workers.values() if w.result is not None}
    assert sorted(results) == sorted(set(range(CANDIDATES)) - {dead})
    assert sorted(t for r in results.values() for t in r["led"]) == [row.term for row in led[1:]]
    print(
        f"{backend}: {len(led)} terms; new leader {second[2] - killed_at:.2f} s after the kill; "
        f"paused {resumed - stopped:.2f} s, learned it lost {led[1].ended - resumed:.3f} s after"
    )
