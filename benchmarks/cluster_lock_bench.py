"""The async lock on Redis Cluster against one Redis node: 8 tasks on one key, one run.

    uv run python benchmarks/cluster_lock_bench.py [--rounds 5] [--seconds 1.5] [--workers 8]

Starts a private redis-server and a private 3-primary Cluster (throw-away
processes on free loopback ports, stopped by PID). Each worker (a task with a
backend and client of its own, as separate processes would have: so every
hand-over is a pub/sub message; ``--shared`` gives them one) loops acquire
-> tiny critical section -> release on one key for a fixed time; the table
gives grants/s (median over rounds), the lowest worker share (fairness; 1/8 is
12.5 %), whether exclusion held, and the ratio to the single node's rate.

Subjects (rounds interleave them, order alternating):

- ``single, redis-py``: one node, every script through redis-py (``own_connection=False``),
  waiters woken on the classic channel. What a Cluster client does today, so the
  Cluster rows differ from it by the Cluster alone.
- ``single, headway's connection``: one node as shipped (pipelined, riders).
- ``cluster, sharded``: the Cluster as shipped: ``SPUBLISH`` / ``SSUBSCRIBE`` on the
  shard that owns the lock's slot, one pub/sub connection per primary.
- ``cluster, classic``: the Cluster before it: ``PUBLISH`` (copied over the Cluster
  bus to every node) and one redis-py Cluster pub/sub connection.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis import asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import RedisServers

import headway
from headway.lock.backends.redis.riders import Riders
from headway.lock.backends.redis.waker import Waker


@dataclass
class Subject:
    name: str
    make: Callable[[], tuple[Any, headway.RedisLockBackend]]  # (client, backend)
    ports: list[int]  # the servers it runs on, whose counters it reads
    rates: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)  # server CPU per grant, all nodes
    bus: list[float] = field(default_factory=list)  # Cluster bus publish messages per grant
    min_share: float = 1.0
    exclusive: bool = True


def counters(ports: list[int]) -> tuple[float, int]:
    """Server CPU seconds (user + sys) and Cluster bus publish messages sent, summed."""
    cpu, bus = 0.0, 0
    for port in ports:
        client = redis.Redis(port=port)
        try:
            info = client.info("cpu")
            cpu += info["used_cpu_user"] + info["used_cpu_sys"]
            if client.info("cluster").get("cluster_enabled"):
                stats = client.cluster("info")
                bus += sum(
                    int(stats.get(f"cluster_stats_messages_{kind}_sent", 0))
                    for kind in ("publish", "publishshard")
                )
        finally:
            client.close()
    return cpu, bus


def classic(backend: headway.RedisLockBackend) -> headway.RedisLockBackend:
    """``backend`` (on a Cluster client) as it was before sharded channels."""
    backend._sharded = False
    backend._waker = Waker(backend.client, backend.timeout)
    backend._riders = Riders(backend._waker, ordered=True)
    return backend


async def contend(subject: Subject, workers: int, seconds: float, apart: bool) -> None:
    key = f"bench:{uuid.uuid4().hex}"
    made = [subject.make() for _ in range(workers if apart else 1)]
    locks = [headway.Lock(backend, key, ttl=10, timeout=60) for _, backend in made]
    counts = [0] * workers
    inside = most = counter = grants = 0
    for lock in locks:
        await lock.release(await lock.acquire())  # connect, load the scripts
    cpu, bus = counters(subject.ports)
    stop = time.monotonic() + seconds

    async def run(i: int) -> None:
        nonlocal inside, most, counter, grants
        lock = locks[i % len(locks)]
        while time.monotonic() < stop:
            lease = await lock.acquire()
            granted = time.monotonic()
            inside += 1
            most = max(most, inside)
            value = counter
            await asyncio.sleep(0)  # let another task in, if the lock did not keep it out
            counter = value + 1
            inside -= 1
            grants += 1
            await lock.release(lease)
            counts[i] += granted < stop

    await asyncio.gather(*(run(i) for i in range(workers)))
    cpu_after, bus_after = counters(subject.ports)
    subject.cpu_us.append((cpu_after - cpu) * 1e6 / grants)
    subject.bus.append((bus_after - bus) / grants)
    for client, backend in made:
        await backend.aclose()
        await client.aclose()
    total = sum(counts)
    subject.rates.append(total / seconds)
    subject.min_share = min(subject.min_share, min(counts) / total if total else 0.0)
    subject.exclusive &= most == 1 and counter == grants


def subjects(single: int, cluster: list[int]) -> list[Subject]:
    def on_single(own_connection: bool) -> Callable[[], tuple[Any, headway.RedisLockBackend]]:
        def make() -> tuple[Any, headway.RedisLockBackend]:
            client = aioredis.Redis(port=single)
            return client, headway.RedisLockBackend(client, own_connection=own_connection)

        return make

    def on_cluster(sharded: bool) -> Callable[[], tuple[Any, headway.RedisLockBackend]]:
        def make() -> tuple[Any, headway.RedisLockBackend]:
            client = RedisCluster(host="127.0.0.1", port=cluster[0])
            backend = headway.RedisLockBackend(client)
            return client, backend if sharded else classic(backend)

        return make

    return [
        Subject("single, redis-py", on_single(False), [single]),
        Subject("single, headway's connection", on_single(True), [single]),
        Subject("cluster, sharded (now)", on_cluster(True), cluster),
        Subject("cluster, classic (before)", on_cluster(False), cluster),
    ]


def report(results: list[Subject], workers: int, apart: bool) -> None:
    backends = "a backend and client each" if apart else "one backend"
    print(f"\n{workers} tasks on one key, {backends}; medians of {len(results[0].rates)} rounds\n")
    print(
        "| subject | grants/s | x single, redis-py (paired per round) "
        "| server CPU µs/grant (all nodes) "
        "| bus publishes/grant | lowest share | exclusive |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for s in results:
        rate = statistics.median(s.rates)
        # The ratio is paired per round (same round, neighbouring runs), then the median.
        paired = statistics.median(a / b for a, b in zip(s.rates, results[0].rates, strict=True))
        print(
            f"| {s.name} | {rate:,.0f} | {paired:.2f}x | "
            f"{statistics.median(s.cpu_us):.0f} | {statistics.median(s.bus):.2f} | "
            f"{s.min_share:.1%} | {'yes' if s.exclusive else 'NO'} |"
        )
    for s in results:
        print(f"  {s.name}: " + ", ".join(f"{r:,.0f}" for r in s.rates), file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--shared",
        action="store_true",
        help="one backend for all workers (its own waiters are told without a message)",
    )
    args = parser.parse_args()
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    with tempfile.TemporaryDirectory() as folder:
        servers = RedisServers(binary, Path(folder))
        try:
            single = servers.start().port
            cluster = [node.port for node in servers.cluster(3)]
            results = subjects(single, cluster)
            for round_ in range(args.rounds):
                for subject in results if round_ % 2 == 0 else results[::-1]:
                    print(f"  round {round_ + 1}/{args.rounds}: {subject.name}", file=sys.stderr)
                    asyncio.run(contend(subject, args.workers, args.seconds, not args.shared))
        finally:
            servers.stop_all()
    report(results, args.workers, not args.shared)


if __name__ == "__main__":
    main()
