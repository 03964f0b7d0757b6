"""Several OS processes call one idempotent function's key at once, on PostgreSQL + Redis."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from redis import asyncio as aioredis
from sqlalchemy.ext.asyncio import create_async_engine

from headway import IdempotencyInProgress, RecordStore, RedisLockBackend, idempotent_function
from headway.idempotency.table import metadata, records

from .test_processes import all_rows, completion_waiting, take_over

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LEASE = 2.0  # the workers' lease: what is left of it when one is killed covers our first call
Spawn = Callable[[str, int], "subprocess.Popen[str]"]


@pytest.fixture
async def clean(postgres_url: str, redis_url: str) -> None:
    engine = create_async_engine(postgres_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(records.delete())
    await engine.dispose()
    redis = aioredis.Redis.from_url(redis_url)
    await redis.flushdb()
    await redis.aclose()


@pytest.fixture
def effects(tmp_path: Path) -> Path:
    path = tmp_path / "effects.log"
    path.touch()
    return path


@pytest.fixture
def spawn(postgres_url: str, redis_url: str, effects: Path, tmp_path: Path) -> Iterator[Spawn]:
    procs: list[subprocess.Popen[str]] = []
    env = {
        **os.environ,
        "HEADWAY_TEST_EFFECTS": str(effects),
        "HEADWAY_TEST_DATABASE_URL": postgres_url,
        "HEADWAY_TEST_REDIS_URL": redis_url,
        "HEADWAY_TEST_LEASE": str(LEASE),
        "HEADWAY_TEST_GATE": str(tmp_path / "gate"),
    }

    def start(mode: str, calls: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.idempotency.function_worker", mode, str(calls)],
            cwd=ROOT, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


def go(procs: list[subprocess.Popen[str]]) -> None:
    """Start every ready process at once."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


@pytest.mark.usefixtures("clean")
async def test_processes_tasks_and_threads_one_key_body_runs_once(
    spawn: Spawn, effects: Path
) -> None:
    procs = [spawn("async", 20), spawn("async", 20), spawn("sync", 8), spawn("sync", 8)]
    go(procs)
    results: list[Any] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        results.extend(json.loads(out.splitlines()[-1]))
    assert len(effects.read_text().splitlines()) == 1  # charged once, across 4 processes
    assert len(results) == 56
    assert all(r == results[0] for r in results)  # every caller got the first one's result
    assert results[0]["effects"] == 1


async def test_a_killed_worker_key_runs_again_after_its_lease(
    clean: None, spawn: Spawn, effects: Path, postgres_url: str, redis_url: str
) -> None:
    worker = spawn("hang", 1)
    go([worker])
    while not effects.read_text():
        time.sleep(0.02)  # another process's progress: polled, bounded by the test's timeout
    os.kill(worker.pid, signal.SIGKILL)
    killed = time.monotonic()
    worker.wait(30)

    store = RecordStore.from_url(postgres_url)
    redis = aioredis.Redis.from_url(redis_url)
    lock = RedisLockBackend(redis)
    runs: list[float] = []

    @idempotent_function(
        store=store, lock_backend=lock, namespace="tests.function_worker.charge", lease_ttl=LEASE
    )
    async def charge(order: str, amount: int) -> dict[str, Any]:
        runs.append(time.monotonic() - killed)
        return {"order": order}

    try:
        with pytest.raises(IdempotencyInProgress):
            await charge("o-1", 500)  # the dead worker's lease still lives
        while True:  # usable again once the lease has run out
            try:
                assert await charge("o-1", 500) == {"order": "o-1"}
                break
            except IdempotencyInProgress:
                assert time.monotonic() - killed < LEASE + 1.0, "key still stuck"
                time.sleep(0.05)
    finally:
        await lock.aclose()
        await redis.aclose()
        await store.aclose()
    assert len(runs) == 1
    assert runs[0] < LEASE + 1.0


async def test_a_paused_workers_late_completion_is_rejected_by_the_fence(
    clean: None, spawn: Spawn, effects: Path, postgres_url: str, tmp_path: Path
) -> None:
    """The function face's twin of the middleware's paused-worker test: worker A's
    completion arrives while a newer claim holds the record PROCESSING (same key, status
    and fingerprint), so only the fencing token can refuse it."""
    worker = spawn("gate", 1)
    go([worker])
    while not effects.read_text():
        await asyncio.sleep(0.02)  # another process's progress: polled, bounded by the test
    engine = create_async_engine(postgres_url)
    stopped = False
    try:
        async with engine.begin() as holder:  # holds A's row until it commits
            lock_row = sa.select(records.c.scope, records.c.key, records.c.fingerprint)
            first = (
                await holder.execute(lock_row.add_columns(records.c.fence).with_for_update())
            ).one()
            (tmp_path / "gate").touch()  # A's body returns; its completion queues behind us
            await asyncio.wait_for(completion_waiting(engine), 20)
            os.kill(worker.pid, signal.SIGSTOP)  # ...and A stalls, its write in flight
            stopped = True
            # A newer claim takes the record over once A's lease is over.
            newer = await take_over(holder, first.scope, first.key, first.fingerprint)
        # Committed: A's queued completion now meets the newer claim's record.
        os.kill(worker.pid, signal.SIGCONT)
        stopped = False
        out, _ = worker.communicate(timeout=60)
        rows = await all_rows(engine)
    finally:
        if stopped:
            os.kill(worker.pid, signal.SIGCONT)
        await engine.dispose()
    assert newer.fence is not None
    assert newer.fence > first.fence
    assert json.loads(out.splitlines()[-1]) == ["LockLost"]  # A's caller learns it did not count
    # The newer claim's record is untouched: still PROCESSING, under its fence, no result.
    assert rows == [("PROCESSING", newer.fence, None)]
