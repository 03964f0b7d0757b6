"""Several processes, several tasks (or threads) each, one Redis lock: counted exactly.

Tasks of one process ride on each other's releases (one script per grant);
tasks of the other processes wait in Redis and are woken on the channel. Both
hand-overs interleave here, and every section is checked: never two holders, no
lost increment, fences strictly increasing in the order the sections ran, every
task done.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import uuid
from pathlib import Path

import pytest
from redis import asyncio as aioredis

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
PROCESSES, TASKS, SECTIONS = 3, 4, 40


@pytest.mark.parametrize("mode", ["async", "sync"], ids=["tasks", "threads"])
async def test_processes_of_many_tasks_exclude_each_other_exactly(
    redis_url: str, mode: str
) -> None:
    resource = f"mixed-{uuid.uuid4().hex}"
    args = (mode, redis_url, resource, str(TASKS), str(SECTIONS))
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "tests.lock.mixed_worker", *args),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(PROCESSES)
    ]
    try:
        async with asyncio.timeout(60):
            outputs = [await w.communicate() for w in workers]
    finally:
        for w in workers:
            if w.returncode is None:
                w.kill()
                await w.wait()
    async with aioredis.Redis.from_url(redis_url) as client:
        counter = int(await client.get(f"{resource}:counter") or 0)
        fences = [int(f) for f in await client.lrange(f"{resource}:fences", 0, -1)]
        await client.delete(*(f"{resource}:{k}" for k in ("counter", "fences", "inside")))

    reports = []
    for worker, (out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err.decode()[-3000:]
        reports.append(json.loads(out))
    total = PROCESSES * TASKS * SECTIONS
    assert [r["done"] for r in reports] == [[SECTIONS] * TASKS] * PROCESSES
    assert max(r["crowd"] for r in reports) == 1  # never two holders inside
    assert counter == total  # no lost increment
    assert len(fences) == total
    assert all(a < b for a, b in itertools.pairwise(fences))  # in the order sections ran
    # Rides on a holder of the same process happened, beside waits in Redis.
    assert sum(r["rides"] for r in reports) > 0
    assert sum(r["queued"] for r in reports) > 0
