"""One Redis against a 3-shard Redis Cluster: headway's limiter and lock, and limits on the Cluster.

    uv run --group bench python benchmarks/cluster_bench.py [--quick]

Starts its own throw-away servers (tests/servers.py): one plain redis-server and a
Cluster of three primaries, all on loopback, and measures in one process, in
interleaved rounds (every subject once per round; medians over rounds):

- limiter p50: ``RateLimiter(TokenBucket)`` over 1,000 keys, one call at a time;
- limiter throughput: 32 tasks deciding over 1,000 keys (decisions/s);
- lock cycles: acquire + release by one task, uncontended (cycles/s);
- lock grants: 8 tasks sharing one ``Lock`` on one resource (grants/s);
- client CPU per decision: this process's CPU time in the throughput phase over the
  decisions made (on a 2-vCPU machine the three shards' servers compete with the client
  for the same cores; this is the client's own cost, whatever the servers take);
- Redis CPU per decision: the servers' ``used_cpu_user + used_cpu_sys`` (summed over
  the shards) during the throughput phase, divided by the decisions made: what a
  shard's one core can decide per second under pipelined load.

``limits`` (its fixed window, the cheapest of its strategies) runs on the same
Cluster through its ``async+redis+cluster`` storage, for the limiter rows. A row with
the keys of one shard only separates headway's own cost on a Cluster from the
machine's cost of waking three server processes in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis import asyncio as aioredis

import headway
from headway.ratelimit.backends.redis_scripts import state_keys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import RedisServers

KEYS = 1_000
WORKERS = 32
LOCK_WORKERS = 8

Decide = Callable[[str], Awaitable[object]]


@dataclass(frozen=True)
class Config:
    rounds: int
    latency_calls: int  # one at a time, per round
    throughput_calls: int  # per round, over WORKERS tasks
    lock_cycles: int  # per round, one task
    lock_grants: int  # per round, over LOCK_WORKERS tasks


FULL = Config(rounds=7, latency_calls=2_000, throughput_calls=20_000, lock_cycles=2_000,
              lock_grants=3_000)  # fmt: skip
QUICK = Config(rounds=2, latency_calls=300, throughput_calls=3_000, lock_cycles=300,
               lock_grants=400)  # fmt: skip


@dataclass
class Samples:
    p50: list[float] = field(default_factory=list)  # seconds, one median per round
    rate: list[float] = field(default_factory=list)  # decisions/s
    cpu: list[float] = field(default_factory=list)  # Redis CPU seconds per decision
    client: list[float] = field(default_factory=list)  # this process's CPU s per decision
    cycles: list[float] = field(default_factory=list)  # lock cycles/s, one task
    grants: list[float] = field(default_factory=list)  # lock grants/s, 8 tasks on one key


@dataclass
class Subject:
    """A limiter (and, for headway, a lock backend) on one deployment."""

    name: str
    decide: Decide
    ports: list[int]  # the servers whose CPU the decisions cost
    lock: headway.RedisLockBackend | None
    close: Callable[[], Awaitable[None]]
    samples: Samples = field(default_factory=Samples)
    keys: list[str] = field(default_factory=lambda: [f"user-{i}" for i in range(KEYS)])


def redis_cpu(ports: list[int]) -> float:
    """CPU seconds the servers on ``ports`` have used so far (user + system)."""
    total = 0.0
    for port in ports:
        with redis.Redis(port=port) as client:
            info = client.info("cpu")
            total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


POLICY = headway.TokenBucket(100_000, 100_000, 1.0)


async def headway_subject(name: str, client: Any, ports: list[int]) -> Subject:
    backend = headway.RedisRateLimitBackend(client)
    limiter = headway.RateLimiter(POLICY, backend=backend)
    lock = headway.RedisLockBackend(client)

    async def decide(key: str) -> object:
        decision = await limiter.hit(key)
        assert decision.source is headway.Source.BACKEND, decision
        return decision

    async def close() -> None:
        await lock.aclose()
        await backend.aclose()
        await client.aclose()

    return Subject(name, decide, ports, lock, close)


async def limits_subject(ports: list[int]) -> Subject:
    from limits import RateLimitItemPerSecond
    from limits.aio.storage import RedisClusterStorage
    from limits.aio.strategies import FixedWindowRateLimiter

    storage = RedisClusterStorage(
        f"async+redis+cluster://127.0.0.1:{ports[0]}", implementation="redispy"
    )
    limiter = FixedWindowRateLimiter(storage)
    item = RateLimitItemPerSecond(100_000)

    async def decide(key: str) -> object:
        return await limiter.hit(item, key)

    async def close() -> None:
        await storage.reset()

    return Subject("limits fixed window, Cluster", decide, ports, None, close)


async def one_shard(cluster: list[int]) -> Subject:
    """headway on the Cluster with keys of one shard only: its client's own cost, apart from
    the machine's cost of waking three servers in turn."""
    client = aioredis.RedisCluster(host="127.0.0.1", port=cluster[0])
    await client.initialize()
    first = client.get_node(host="127.0.0.1", port=cluster[0])
    names = (f"user-{i}" for i in range(100 * KEYS))
    keys = [k for k in names if client.get_node_from_key(state_keys(k, [POLICY])[0]) is first]
    subject = await headway_subject("headway, Cluster, one shard's keys", client, cluster[:1])
    subject.keys, subject.lock = keys[:KEYS], None
    return subject


async def latency(subject: Subject, calls: int, offset: int) -> None:
    stamps = []
    for i in range(calls):
        started = time.perf_counter()
        await subject.decide(subject.keys[(offset + i) % KEYS])
        stamps.append(time.perf_counter() - started)
    subject.samples.p50.append(statistics.median(stamps))


async def throughput(subject: Subject, calls: int) -> None:
    per_task = calls // WORKERS

    async def worker(w: int) -> None:
        for i in range(per_task):
            await subject.decide(subject.keys[(w * per_task + i) % KEYS])

    cpu = redis_cpu(subject.ports)
    client = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(WORKERS)))
    elapsed = time.perf_counter() - started
    made = per_task * WORKERS
    subject.samples.client.append((time.process_time() - client) / made)
    subject.samples.cpu.append((redis_cpu(subject.ports) - cpu) / made)
    subject.samples.rate.append(made / elapsed)


async def lock_cycles(subject: Subject, cycles: int, round_: int) -> None:
    assert subject.lock is not None
    lock = headway.Lock(subject.lock, f"cycle-{round_}", ttl=10, timeout=10)
    started = time.perf_counter()
    for _ in range(cycles):
        await lock.release(await lock.acquire())
    subject.samples.cycles.append(cycles / (time.perf_counter() - started))


async def lock_grants(subject: Subject, grants: int, round_: int) -> None:
    assert subject.lock is not None
    lock = headway.Lock(subject.lock, f"shared-{round_}", ttl=10, timeout=30)
    per_task = grants // LOCK_WORKERS
    fences: list[int] = []

    async def worker() -> None:
        for _ in range(per_task):
            lease = await lock.acquire()
            fences.append(lease.fence)
            await lock.release(lease)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(LOCK_WORKERS)))
    subject.samples.grants.append(len(fences) / (time.perf_counter() - started))
    assert len(set(fences)) == len(fences), "two grants with one fence"


async def run(single: int, cluster: list[int], cfg: Config) -> list[Subject]:
    subjects = [
        await headway_subject("headway, single node", aioredis.Redis(port=single), [single]),
        await headway_subject(
            "headway, 3-shard Cluster",
            aioredis.RedisCluster(host="127.0.0.1", port=cluster[0]),
            cluster,
        ),
        await one_shard(cluster),
        await limits_subject(cluster),
    ]
    for subject in subjects:  # warm up: connections, scripts, keys
        await latency(subject, KEYS, 0)
        subject.samples = Samples()
    gc.collect()
    for round_ in range(cfg.rounds):
        order = subjects if round_ % 2 == 0 else subjects[::-1]
        for subject in order:
            await latency(subject, cfg.latency_calls, round_)
            await throughput(subject, cfg.throughput_calls)
            if subject.lock is not None:
                await lock_cycles(subject, cfg.lock_cycles, round_)
                await lock_grants(subject, cfg.lock_grants, round_)
        print(f"round {round_ + 1}/{cfg.rounds} done", file=sys.stderr)
    for subject in subjects:
        await subject.close()
    return subjects


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(subjects: list[Subject], cfg: Config) -> None:
    single = subjects[0].samples
    print(f"{cfg.rounds} rounds, medians; ratios against headway on the single node\n")
    print(
        "| subject | limiter p50 (µs) | limiter, 32 tasks (decisions/s) | client CPU per "
        "decision (µs) | Redis CPU per decision (µs) | lock cycles/s, 1 task | "
        "lock grants/s, 8 tasks on one key |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for subject in subjects:
        s = subject.samples
        cells = [
            (_median(s.p50) * 1e6, _median(single.p50) * 1e6, "{:.0f}"),
            (_median(s.rate), _median(single.rate), "{:,.0f}"),
            (_median(s.client) * 1e6, _median(single.client) * 1e6, "{:.1f}"),
            (_median(s.cpu) * 1e6, _median(single.cpu) * 1e6, "{:.1f}"),
            (_median(s.cycles), _median(single.cycles), "{:,.0f}"),
            (_median(s.grants), _median(single.grants), "{:,.0f}"),
        ]
        row = [
            "-" if value != value else f"{form.format(value)} ({value / base:.2f}x)"
            for value, base, form in cells
        ]
        print(f"| {subject.name} | " + " | ".join(row) + " |")
    # Each decision runs on one shard: the shards' CPU over the decisions is one decision's.
    cpu = _median(subjects[1].samples.cpu)
    print(
        f"\nRedis CPU per decision on a shard: {cpu * 1e6:.1f} µs: one shard's core decides "
        f"about {1 / cpu:,.0f} per second under pipelined load."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two short rounds")
    cfg = QUICK if parser.parse_args().quick else FULL
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    with tempfile.TemporaryDirectory() as folder:
        servers = RedisServers(binary, Path(folder))
        try:
            single = servers.start().port
            cluster = [node.port for node in servers.cluster(3)]
            subjects = asyncio.run(run(single, cluster, cfg))
        finally:
            servers.stop_all()
    report(subjects, cfg)


if __name__ == "__main__":
    main()
