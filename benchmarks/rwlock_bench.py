"""Read-write lock benchmark (issue 27): ``ReadWriteLock`` beside the exclusive ``Lock``.

    uv run python benchmarks/rwlock_bench.py [--runs 5] [--seconds 2] [--url redis://HOST:PORT/DB]
        [--writes 0.1] [--section 0.001] [--memory]

On Redis with from_url defaults (a plain ``redis.asyncio.Redis.from_url`` client, the
backend untuned), 8 asyncio tasks work on ONE name: each loops acquire -> a fixed
section (an awaited 1 ms sleep) -> release, choosing a read 90 % of the time and a
write 10 % (a seeded sequence per task: every subject sees the same mix). The
``ReadWriteLock`` takes its read or write lock; the exclusive ``Lock`` takes the one
lock for both. Reported: read and write grants/s, medians of ``--runs`` runs (the
subjects alternate within each run, so load drift skews them alike), and whether the
holders ever overlapped (a writer with anybody, or anybody under the exclusive lock).

Without ``--url`` it starts a private redis-server on a free loopback port. ``--memory``
runs the same over ``MemoryLockBackend``, the rule without round trips: its ceiling.
Target (issue 27): read grants/s of the read-write lock >= 3 x the exclusive Lock's grants/s.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from redis import asyncio as aioredis

from headway import Lock, MemoryLockBackend, RedisLockBackend
from headway.lock.shared import ReadWriteLock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import private_redis

TASKS = 8
WRITES = 0.10
SECTION = 0.001  # seconds, awaited
SUBJECTS = ("exclusive Lock", "ReadWriteLock")


@dataclass
class Run:
    reads: int = 0
    writes: int = 0
    overlaps: int = 0
    inside: dict[str, int] = field(default_factory=lambda: {"read": 0, "write": 0})


async def _phase(
    url: str, subject: str, seconds: float, run_no: int, writes: float, section: float
) -> tuple[float, float, int]:
    client = None if url == "memory" else aioredis.Redis.from_url(url)
    backend = MemoryLockBackend() if client is None else RedisLockBackend(client)
    name = f"rwbench:{run_no}:{subject}"
    exclusive = Lock(backend, name, ttl=10, timeout=30)
    rw = ReadWriteLock(backend, name, ttl=10, timeout=30)
    # Warm up: scripts loaded, connection and subscription made, outside the timing.
    for lock in (exclusive, rw.read, rw.write):
        await lock.release(await lock.acquire())
    run = Run()
    stop = time.perf_counter() + seconds

    async def worker(seed: int) -> None:
        mix = random.Random(seed)
        while time.perf_counter() < stop:
            kind = "write" if mix.random() < writes else "read"
            lock = exclusive if subject == "exclusive Lock" else getattr(rw, kind)
            lease = await lock.acquire()
            run.inside[kind] += 1
            alone = subject == "exclusive Lock" or kind == "write"
            if run.inside["write"] > 1 or (alone and sum(run.inside.values()) > 1):
                run.overlaps += 1
            await asyncio.sleep(section)
            run.inside[kind] -= 1
            await lock.release(lease)
            if kind == "write":
                run.writes += 1
            else:
                run.reads += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(seed) for seed in range(TASKS)))
    elapsed = time.perf_counter() - started
    if client is not None:
        assert isinstance(backend, RedisLockBackend)
        await backend.aclose()
        await client.aclose()
    return run.reads / elapsed, run.writes / elapsed, run.overlaps


@contextmanager
def redis_url(url: str | None) -> Iterator[str]:
    """``url`` as given, or a private redis-server started for this run."""
    if url is not None:  # or "memory"
        yield url
        return
    with private_redis(db=7) as private:
        yield private


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--url", default=None)
    parser.add_argument("--writes", type=float, default=WRITES, help="share of writes")
    parser.add_argument("--section", type=float, default=SECTION, help="seconds held")
    parser.add_argument(
        "--memory", action="store_true", help="the in-memory reference model: no round trips"
    )
    args = parser.parse_args()
    rates: dict[str, list[tuple[float, float]]] = {s: [] for s in SUBJECTS}
    overlaps = dict.fromkeys(SUBJECTS, 0)
    with redis_url("memory" if args.memory else args.url) as url:
        for run_no in range(args.runs):
            for subject in SUBJECTS if run_no % 2 == 0 else SUBJECTS[::-1]:
                print(f"  run {run_no + 1}/{args.runs}: {subject}", file=sys.stderr)
                reads, writes, overlapped = asyncio.run(
                    _phase(url, subject, args.seconds, run_no, args.writes, args.section)
                )
                rates[subject].append((reads, writes))
                overlaps[subject] += overlapped
    med = {s: [statistics.median(r[i] for r in rates[s]) for i in (0, 1)] for s in SUBJECTS}
    base = sum(med["exclusive Lock"])
    what = f"{args.writes:.0%} writes, {args.section * 1000:g} ms section"
    print(
        f"\n{TASKS} tasks on one name, {what}, medians of {args.runs} runs of {args.seconds:g} s:\n"
    )
    print("| lock | read grants/s | write grants/s | all grants/s | reads x exclusive | overlaps |")
    print("| --- | --- | --- | --- | --- | --- |")
    for s in SUBJECTS:
        reads, writes = med[s]
        print(f"| {s} | {reads:.0f} | {writes:.0f} | {reads + writes:.0f} | "
              f"{reads / base:.2f} | {overlaps[s]} |")  # fmt: skip
    ratio = med["ReadWriteLock"][0] / base
    verdict = "met" if ratio >= 3 else "NOT met"
    print(f"\nTarget: read grants/s >= 3 x the exclusive Lock's grants/s: {ratio:.2f} x, {verdict}")


if __name__ == "__main__":
    main()
