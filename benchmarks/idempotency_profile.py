"""Where a first execution's time goes with N concurrent tasks: per-step wall time, this
process's CPU, PostgreSQL's CPU and WAL flushes, beside a peer in the same harness.

    uv run --group bench python benchmarks/idempotency_profile.py headway 16 1600
    uv run --group bench python benchmarks/idempotency_profile.py asgi-idempotency-header 16 1600
    HEADWAY_PROFILE_SYNC_OFF=1 uv run --group bench python benchmarks/idempotency_profile.py ...

Steps are timed by wrapping ``RecordStore`` and ``Lock`` methods in this process only.
PostgreSQL's CPU is read from ``/proc`` (every ``postgres`` process on the machine, so
run it on a quiet one) and its WAL flushes from ``pg_stat_wal`` (cluster-wide).
``HEADWAY_PROFILE_SYNC_OFF`` sets ``synchronous_commit=off`` on the engine's sessions.
"""

from __future__ import annotations

import asyncio
import glob
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from _idem_apps import BUILDERS
from idempotency_bench import DATABASE_URL, call, fresh_key
from redis import asyncio as aioredis
from sqlalchemy.ext.asyncio import AsyncEngine

from headway.idempotency.store import RecordStore
from headway.idempotency.table import records
from headway.lock.lock import Lock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import private_redis

STEPS: dict[str, list[float]] = {}


def timed(owner: Any, name: str) -> None:
    """Record the wall time of every ``owner.name`` call under ``STEPS[name]``."""
    original = getattr(owner, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            STEPS.setdefault(name, []).append(time.perf_counter() - start)

    setattr(owner, name, wrapper)


def postgres_cpu() -> float:
    """CPU seconds (user + system) of every process named postgres."""
    ticks = 0
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            stat = Path(path).read_text()
        except OSError:
            continue
        if "(postgres)" in stat:
            fields = stat.rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


async def wal_syncs(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(sa.text("SELECT wal_sync FROM pg_stat_wal"))).scalar_one())


async def run(redis_url: str, subject: str, tasks: int, total: int) -> None:
    settings = {"synchronous_commit": "off"} if os.environ.get("HEADWAY_PROFILE_SYNC_OFF") else {}
    store = RecordStore.from_url(
        os.environ.get("HEADWAY_PROFILE_DATABASE_URL", DATABASE_URL),
        engine_options={"connect_args": {"server_settings": settings}},
    )
    engine = store.engine
    client = aioredis.Redis.from_url(redis_url)
    async with engine.begin() as conn:
        await conn.run_sync(records.create, checkfirst=True)
        await conn.execute(records.delete())
    for method in ("get", "claim", "complete"):
        timed(RecordStore, method)
    for method in ("acquire", "release"):
        timed(Lock, method)
    app = BUILDERS[subject](store, client)
    for _ in range(50):
        await call(app, fresh_key())
    STEPS.clear()
    per_task = total // tasks

    async def worker() -> None:
        for _ in range(per_task):
            start = time.perf_counter()
            assert (await call(app, fresh_key()))[0] == 201
            STEPS.setdefault("request", []).append(time.perf_counter() - start)

    syncs, cpu, pg = await wal_syncs(engine), time.process_time(), postgres_cpu()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    elapsed = time.perf_counter() - start
    cpu, pg = time.process_time() - cpu, postgres_cpu() - pg
    syncs = await wal_syncs(engine) - syncs
    n = per_task * tasks
    print(f"{subject}, {tasks} tasks: {n / elapsed:.0f} req/s")
    print(f"  this process: {cpu / n * 1e3:.2f} ms CPU per request ({cpu / elapsed:.0%} of a core)")
    print(f"  postgres: {pg / n * 1e3:.2f} ms CPU per request; WAL flushes {syncs / n:.2f}/request")
    for step, samples in STEPS.items():
        print(f"  {step:10s} p50 {statistics.median(samples) * 1e3:6.2f} ms (n={len(samples)})")
    await client.aclose()
    await engine.dispose()


def main() -> None:
    subject, tasks, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with private_redis() as url:
        asyncio.run(run(url, subject, tasks, total))


if __name__ == "__main__":
    main()
