"""The fleet proof of ``run_once``: OS processes, offset clocks, a runner SIGKILLed.

Four instances (``once_worker.py``) call one ``run_once`` job at the same scheduled
moments, each with its clock offset by up to half of ``at_least_for`` (it calls that
much later than the first), for 9 windows. Every run is logged in PostgreSQL. In
window ``KILL`` the runner is SIGKILLed mid-run. The log must show exactly one run in
every window, except after the kill: no window runs until the dead runner's lease or
claim ran out (``at_most_for``), and the first window after that runs. On Redis and etcd
the lease outlives its process; on PostgreSQL and MySQL, whose locks end with their
session, ``run_once`` claims the window in a table (``WindowClaimBackend``), which does.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.lock.once_worker import Plan, runs_table
from tests.lock.safety_harness import Crowd, Worker, drop_redis_keys, service_urls, spawn

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

INSTANCES = 4
PERIOD, AT_LEAST_FOR, KILL = 1.5, 0.8, 5
#: at_most_for per backend (etcd's leases are whole seconds), and how late after it a
#: dead runner's lock is sure to be free (etcd revokes expired leases every 0.5 s).
AT_MOST_FOR = {"redis": 2.5, "postgres": 2.5, "mysql": 2.5, "etcd": 2.0}
SLACK = {"redis": 0.3, "postgres": 0.3, "mysql": 0.3, "etcd": 0.9}
BUDGET = 60.0


def plan_for(backend: str) -> Plan:
    # The first window sure to run after the kill, and one more after it.
    free = KILL + math.ceil((AT_MOST_FOR[backend] + SLACK[backend]) / PERIOD)
    return Plan(INSTANCES, PERIOD, AT_MOST_FOR[backend], AT_LEAST_FOR, free + 2, KILL)


@dataclass
class Fleet(Crowd):
    """The parent's side: starts the instances together, kills the runner when told."""

    killed: list[int] = field(default_factory=list)
    base: float = 0.0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kind, index, pid = (await reader.readline()).decode().split()
        assert kind == "ready"
        w = self.workers[int(index)] = Worker(int(index), int(pid), reader, writer)
        if len(self.workers) == self.size:
            self.base = time.time() + 0.5
            self.all_ready.set()
        await self.all_ready.wait()
        await w.answer(f"start {self.base}")
        while line := await reader.readline():
            kind, _, arg = line.decode().strip().partition(" ")
            if kind == "kill-me" and not self.killed:
                os.kill(w.pid, signal.SIGKILL)
                self.killed.append(w.index)
            elif kind == "kill-me":
                await w.answer("go")
            else:
                assert kind == "done", line
                w.result = json.loads(arg)
        writer.close()


@pytest.mark.parametrize(
    "backend", ["redis", "postgres", pytest.param("mysql", marks=pytest.mark.mysql), "etcd"]
)
async def test_one_run_per_window_across_offset_clocks_and_a_killed_runner(
    backend: str,
    redis_url: str,
    postgres_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    plan = plan_for(backend)
    table = f"hw_once_{uuid.uuid4().hex[:12]}"
    metadata, runs = runs_table(table)
    engine = create_async_engine(postgres_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    resource = f"once-{uuid.uuid4().hex}"
    fleet = Fleet(INSTANCES)
    try:
        urls = service_urls(backend, redis_url, postgres_url, request)
        namespace = f"headway-test/{uuid.uuid4().hex}/"
        args = [backend, *plan.args()[:1], table, resource, namespace, *plan.args()[1:]]
        await spawn(
            "tests.lock.once_worker", args, urls, tmp_path / "instances.err", fleet.serve,
            fleet, BUDGET, lambda: f"killed {fleet.killed}",
        )  # fmt: skip
        async with engine.connect() as conn:
            history = (await conn.execute(sa.select(runs).order_by(runs.c.seq))).all()
    finally:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)
        await engine.dispose()
        await drop_redis_keys(redis_url, resource)

    per_window = collections.Counter(row.window for row in history)
    assert len(fleet.killed) == 1
    # Windows starting while the dead runner's lease or claim may live: none ran.
    dead = range(KILL + 1, KILL + math.ceil((plan.at_most_for + SLACK[backend]) / PERIOD))
    assert len(dead) >= 1
    for window in range(plan.windows):
        expected = 0 if window in dead else 1
        assert per_window[window] == expected, (window, per_window)
    # The killed instance ran the kill window first; the survivors' records match the log.
    killer = [row.instance for row in history if row.window == KILL]
    assert killer[:1] == fleet.killed
    results: dict[int, Any] = {w.index: w.result for w in fleet.workers.values() if w.result}
    assert sorted(results) == sorted(set(range(INSTANCES)) - set(fleet.killed))
    recorded = collections.Counter((i, w) for i, r in results.items() for w in r["ran"])
    logged = collections.Counter(
        (row.instance, row.window) for row in history if row.instance not in fleet.killed
    )
    assert recorded == logged
    late = max(r["late"] for r in results.values())
    print(f"{backend}: {len(history)} runs in {plan.windows} windows; latest call {late:.3f} s")
