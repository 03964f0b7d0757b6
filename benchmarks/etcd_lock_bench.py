"""etcd lock benchmark: headway's EtcdLockBackend against aetcd's and etcd3aio's locks.

``headway`` runs over gRPC (the default when grpcio is installed), ``headway-gw`` over
the JSON gateway (``transport="gateway"``), in the same run.

    uv run python benchmarks/etcd_lock_bench.py [--url http://127.0.0.1:2379] [--seconds 4]
        [--rounds 3]

Each lock runs in a subprocess of its own (aetcd and etcd3aio cannot be imported in
one process: their generated protobufs clash), one after the other, in alternating
order over ``--rounds`` rounds, against the same etcd. Per lock: uncontended
acquire+release cycles/s, then 8 tasks looping acquire -> tiny critical section ->
release on one key: grants/s, each worker's share, and mutual exclusion (holders
inside, counted). Rates are medians over rounds; compare ratios within a run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal
from urllib.parse import urlsplit

WORKERS = 8
Pair = tuple[Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[Any]]]


async def _headway(
    url: str, key: str, transport: Literal["grpc", "gateway"] = "grpc"
) -> tuple[Callable[[], Pair], Callable[[], Awaitable[None]]]:
    from headway import EtcdLockBackend, Lock

    backend = EtcdLockBackend(url, namespace=f"bench/{uuid.uuid4().hex}/", transport=transport)
    lock = Lock(backend, key, ttl=10, timeout=60)

    def make() -> Pair:
        return lock.acquire, lock.release

    return make, backend.aclose


async def _headway_gateway(
    url: str, key: str
) -> tuple[Callable[[], Pair], Callable[[], Awaitable[None]]]:
    return await _headway(url, key, "gateway")


async def _aetcd(url: str, key: str) -> tuple[Callable[[], Pair], Callable[[], Awaitable[None]]]:
    import aetcd

    parts = urlsplit(url)
    client = aetcd.Client(host=parts.hostname, port=parts.port)
    await client.connect()

    def make() -> Pair:
        async def acquire() -> Any:
            lock = client.lock(f"bench/{key}".encode(), ttl=10)
            assert await lock.acquire(timeout=60)
            return lock

        async def release(lock: Any) -> None:
            await lock.release()

        return acquire, release

    return make, client.close


async def _etcd3aio(url: str, key: str) -> tuple[Callable[[], Pair], Callable[[], Awaitable[None]]]:
    import etcd3aio

    client = etcd3aio.Etcd3Client([urlsplit(url).netloc])
    await client.connect()

    def make() -> Pair:
        async def acquire() -> Any:
            lock = client.lock(f"bench-{key}", ttl=10)
            await lock.acquire()
            return lock

        async def release(lock: Any) -> None:
            await lock.release()

        return acquire, release

    return make, client.close


SUBJECTS = {
    "headway": _headway,
    "headway-gw": _headway_gateway,
    "aetcd": _aetcd,
    "etcd3aio": _etcd3aio,
}


async def measure(subject: str, url: str, seconds: float) -> dict[str, Any]:
    key = uuid.uuid4().hex
    make, close = await SUBJECTS[subject](url, key)
    try:
        acquire, release = make()
        await release(await acquire())  # warm up
        n, stop = 0, time.perf_counter() + seconds
        while time.perf_counter() < stop:
            await release(await acquire())
            n += 1
        uncontended = n / seconds
        grants = [0] * WORKERS
        inside = most = 0
        stop = time.perf_counter() + seconds

        async def worker(i: int) -> None:
            nonlocal inside, most
            acquire, release = make()
            while time.perf_counter() < stop:
                held = await acquire()
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0)
                inside -= 1
                grants[i] += 1
                await release(held)

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(WORKERS)))
        elapsed = time.perf_counter() - started
    finally:
        await close()
    total = sum(grants)
    return {
        "uncontended": uncontended,
        "contended": total / elapsed,
        "shares": [round(100 * g / max(total, 1), 1) for g in grants],
        "most_inside": most,
    }


def run(subject: str, url: str, seconds: float) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--one", subject, "--url", url, "--seconds", str(seconds)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:2379")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=SUBJECTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(measure(args.one, args.url, args.seconds))))
        return
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in SUBJECTS}
    for r in range(args.rounds):
        order = list(SUBJECTS) if r % 2 == 0 else list(reversed(SUBJECTS))
        for name in order:
            results[name].append(run(name, args.url, args.seconds))
    print(f"{'lock':11} {'uncontended/s':>14} {'8 workers/s':>12} {'max in':>7}  shares % (last)")
    for name, rows in results.items():
        un = statistics.median(r["uncontended"] for r in rows)
        co = statistics.median(r["contended"] for r in rows)
        most = max(r["most_inside"] for r in rows)
        print(f"{name:11} {un:14.1f} {co:12.1f} {most:7d}  {rows[-1]['shares']}")
    for mine in ("headway", "headway-gw"):
        base = results[mine]
        for name in ("aetcd", "etcd3aio"):
            un = statistics.median(r["uncontended"] for r in base) / statistics.median(
                r["uncontended"] for r in results[name]
            )
            co = statistics.median(r["contended"] for r in base) / statistics.median(
                r["contended"] for r in results[name]
            )
            print(f"{mine} / {name}: uncontended {un:.2f}x, 8 workers {co:.2f}x")


if __name__ == "__main__":
    main()
