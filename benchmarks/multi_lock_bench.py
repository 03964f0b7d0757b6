"""MultiLock on Redis (issue 28): three names in one script against one by one.

    uv run python benchmarks/multi_lock_bench.py [--seconds 2] [--url redis://HOST:PORT/DB]

One task loops ``MultiLock(backend, [3 names]).acquire()`` -> ``release()`` on a free
set, on Redis with from_url defaults (a plain ``redis.asyncio.Redis.from_url`` client,
``RedisLockBackend(client)`` untuned). "one script": the backend as it is (it offers
``acquire_many``); "ordered": the same backend behind a wrapper that offers only
``acquire``/``release``/``extend``, so ``MultiLock`` takes the names one by one. Reported:
cycles/s, and the FCALLs per cycle the server counted (``INFO commandstats``). The two
subjects alternate, twice each, and the better of each pair is kept.

Without ``--url`` it starts a private redis-server on a free loopback port.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from redis import asyncio as aioredis

from headway import Lease, MultiLock, RedisLockBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import private_redis

NAMES = ["order:1", "payment:1", "stock:1"]


class Ordered:
    """The backend without ``acquire_many``: what ``MultiLock`` does for any backend."""

    def __init__(self, backend: RedisLockBackend) -> None:
        self.inner = backend
        self.name = backend.name

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        return await self.inner.acquire(resource, ttl, timeout)

    async def release(self, lease: Lease) -> None:
        await self.inner.release(lease)

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        return await self.inner.extend(lease, ttl)


async def _phase(client: Any, backend: Any, seconds: float) -> tuple[float, float]:
    lock = MultiLock(backend, NAMES, ttl=10)
    await lock.release(await lock.acquire())  # warm: scripts, connection
    await client.config_resetstat()
    cycles, stop = 0, time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < stop:
        await lock.release(await lock.acquire())
        cycles += 1
    elapsed = time.perf_counter() - started
    stats = await client.info("commandstats")
    fcalls = stats.get("cmdstat_fcall", {}).get("calls", 0)
    return cycles / elapsed, fcalls / cycles


async def main(url: str, seconds: float) -> None:
    client = aioredis.Redis.from_url(url)
    backend = RedisLockBackend(client)
    best: dict[str, tuple[float, float]] = {}
    for _ in range(2):
        for subject, subject_backend in (("one script", backend), ("ordered", Ordered(backend))):
            rate, per_cycle = await _phase(client, subject_backend, seconds)
            if rate > best.get(subject, (0.0, 0.0))[0]:
                best[subject] = (rate, per_cycle)
    print("| subject | cycles/s (acquire + release of 3 names) | FCALLs per cycle |")
    print("| --- | --- | --- |")
    for subject, (rate, per_cycle) in best.items():
        print(f"| {subject} | {rate:,.0f} | {per_cycle:.1f} |")
    print(f"one script / ordered: {best['one script'][0] / best['ordered'][0]:.2f}x")
    await backend.aclose()
    await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--url", default=None)
    options = parser.parse_args()
    if options.url:
        asyncio.run(main(options.url, options.seconds))
    else:
        with private_redis() as url:
            asyncio.run(main(url, options.seconds))
