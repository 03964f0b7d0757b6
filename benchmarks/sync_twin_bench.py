"""The sync twins' shell cost: one uncontended acquire + release, async backend vs its twin.

For each backend: N cycles through the async backend (``asyncio.run``), then N through
its sync twin (``headway.lock.backends.sync_twins``) from the main thread, and the
median and p90 of one cycle's wall time. The difference is the private loop's hand-off
(two thread switches per call), measured alone over the memory backend. One run;
compare within a line only.

    ./run.sh python benchmarks/sync_twin_bench.py --cycles 300
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from headway import (
    EtcdLockBackend,
    MemoryLockBackend,
    PostgresLockBackend,
    SyncEtcdLockBackend,
    SyncPostgresLockBackend,
    SyncZooKeeperLockBackend,
    ZooKeeperLockBackend,
)
from headway.lock.backends.blocking import BlockingLockBackend

PG = os.environ.get("HEADWAY_TEST_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1/postgres")
ETCD = os.environ.get("HEADWAY_TEST_ETCD_URL", "http://127.0.0.1:2379")
ZK = os.environ.get("HEADWAY_TEST_ZOOKEEPER_HOSTS", "127.0.0.1:2181")


def summary(times: list[float]) -> str:
    times = sorted(times)
    p90 = times[len(times) * 9 // 10]
    return f"median {statistics.median(times) * 1e3:.3f} ms, p90 {p90 * 1e3:.3f} ms"


async def async_cycles(backend: Any, n: int, close: Callable[[], Any]) -> list[float]:
    times = []
    resource = f"bench-{uuid.uuid4().hex}"
    try:
        await backend.release(await backend.acquire(resource, 30, 0))  # warm up
        for _ in range(n):
            started = time.perf_counter()
            await backend.release(await backend.acquire(resource, 30, 0))
            times.append(time.perf_counter() - started)
    finally:
        await close()
    return times


def sync_cycles(twin: Any, n: int) -> list[float]:
    times = []
    resource = f"bench-{uuid.uuid4().hex}"
    try:
        twin.release(twin.acquire(resource, 30, 0))  # warm up: starts the loop, connects
        for _ in range(n):
            started = time.perf_counter()
            twin.release(twin.acquire(resource, 30, 0))
            times.append(time.perf_counter() - started)
    finally:
        twin.close()
    return times


async def memory(n: int) -> list[float]:
    backend = MemoryLockBackend()

    async def close() -> None:
        return None

    return await async_cycles(backend, n, close)


async def postgres(n: int) -> list[float]:
    engine = create_async_engine(PG)
    backend = PostgresLockBackend(engine)

    async def close() -> None:
        await backend.aclose()
        await engine.dispose()

    return await async_cycles(backend, n, close)


async def etcd(n: int) -> list[float]:
    backend = EtcdLockBackend(ETCD, namespace=f"bench/{uuid.uuid4().hex}/")
    return await async_cycles(backend, n, backend.aclose)


async def zookeeper(n: int) -> list[float]:
    backend = ZooKeeperLockBackend(ZK, prefix=f"/bench/{uuid.uuid4().hex}")
    return await async_cycles(backend, n, backend.aclose)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=300)
    n = parser.parse_args().cycles
    subjects: list[tuple[str, Any, Callable[[], Any]]] = [
        ("memory (the shell alone)", memory, lambda: BlockingLockBackend(MemoryLockBackend())),
        ("postgres", postgres, lambda: SyncPostgresLockBackend(PG)),
        ("etcd", etcd, lambda: SyncEtcdLockBackend(ETCD, namespace=f"bench/{uuid.uuid4().hex}/")),
        (
            "zookeeper",
            zookeeper,
            lambda: SyncZooKeeperLockBackend(ZK, prefix=f"/bench/{uuid.uuid4().hex}"),
        ),
    ]
    for name, run_async, make_twin in subjects:
        async_times = asyncio.run(run_async(n))
        sync_times = sync_cycles(make_twin(), n)
        shell = statistics.median(sync_times) - statistics.median(async_times)
        print(f"{name}: async {summary(async_times)} | twin {summary(sync_times)}", end=" ")
        print(f"| shell {shell * 1e6:+.0f} µs")


if __name__ == "__main__":
    main()
