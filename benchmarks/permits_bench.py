"""Concurrency slots on Redis: server time and instructions per call, and the limiter's cycle.

    PYTHONPATH=. uv run --group bench python benchmarks/permits_bench.py [--rounds 5]
    PYTHONPATH=. uv run --group bench python benchmarks/permits_bench.py --instructions

A slot is one permit of the lock family's semaphore (issue 27): the limiter's acquire is
its answer-at-once call, release and renewal are the semaphore's. This benchmark starts
its own throw-away ``redis-server`` (stopped by PID at the end) and calls the
``ConcurrencyBackend`` primitives of ``SyncRedisRateLimitBackend`` (a public contract,
the same before and after, so one run can compare two source trees: put either on
``PYTHONPATH``). Each row is ``--calls`` calls on one key that already has 50 holders
(a limiter in use): ``acquire`` (granted, each adding a holder), ``release`` (of those),
``extend``, and ``refused`` (an acquire on a key whose one slot is held); then a
``SyncSemaphore``'s fenced acquire and its release, beside 50 holders. The server's
time is the ``usec`` of ``FCALL`` in ``INFO commandstats`` per call (the script's time
inside Redis, its commands included), median over interleaved rounds; with
``--instructions``, the instructions the server ran per call under callgrind
(deterministic, ``_callgrind_redis.py``). Then the client's view: the p50 of an async
``ConcurrencyLimiter`` acquire + release cycle on headway's connection, and ``hold()``
cycles per second, 2,000 sequential each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

from headway import (
    Concurrency,
    ConcurrencyLimiter,
    RedisRateLimitBackend,
    SyncRedisLockBackend,
    SyncRedisRateLimitBackend,
    SyncSemaphore,
)
from headway.lock.lease import Lease

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests
from tests.servers import private_redis

POLICY = Concurrency(100_000, ttl=60.0)
FULL = Concurrency(1, ttl=60.0)
HELD = 50


def _rows(url: str, calls: int) -> dict[str, Callable[[], None]]:
    """The calls of each row, in order (``release`` gives back what ``acquire`` took)."""
    backend = SyncRedisRateLimitBackend.from_url(url, timeout=30)
    for i in range(HELD):
        assert backend.acquire_slot("busy", POLICY, f"held-{i}").granted
    assert backend.acquire_slot("full", FULL, "the-one").granted
    assert backend.acquire_slot("busy", POLICY, "warm").granted  # every script loaded
    assert backend.release_slot("busy", POLICY, "warm")
    assert backend.extend_slot("busy", POLICY, "held-0", 60_000)
    tokens = [f"t-{i}" for i in range(calls)]
    locks = SyncRedisLockBackend(redis.Redis.from_url(url, socket_timeout=30))
    semaphore = SyncSemaphore(locks, "pool", permits=100_000, ttl=60, timeout=0)
    for _ in range(HELD):
        semaphore.acquire()
    semaphore.release(semaphore.acquire())
    permits: list[Lease] = []

    def acquire() -> None:
        for token in tokens:
            assert backend.acquire_slot("busy", POLICY, token).granted

    def release() -> None:
        for token in tokens:
            assert backend.release_slot("busy", POLICY, token)

    def extend() -> None:
        for i in range(calls):
            assert backend.extend_slot("busy", POLICY, f"held-{i % HELD}", 60_000)

    def refused() -> None:
        for token in tokens:
            assert not backend.acquire_slot("full", FULL, token).granted

    def semaphore_acquire() -> None:
        permits[:] = [semaphore.acquire() for _ in range(calls)]

    def semaphore_release() -> None:
        for lease in permits:
            semaphore.release(lease)

    return {
        "acquire": acquire,
        "release": release,
        "extend": extend,
        "refused": refused,
        "Semaphore acquire (fenced)": semaphore_acquire,
        "Semaphore release": semaphore_release,
    }


def _fcall_usec(client: redis.Redis) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_fcall", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def server_time(url: str, rounds: int, calls: int) -> dict[str, float]:
    """Median µs of server time per script call, per row."""
    client = redis.Redis.from_url(url)
    client.flushall()
    rows = _rows(url, calls)
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(rounds):
        for name, run in rows.items():
            client.config_resetstat()
            run()
            n, usec = _fcall_usec(client)
            times[name].append(usec / n)
    client.close()
    return {name: statistics.median(t) for name, t in times.items()}


def instructions(calls: int) -> dict[str, float]:
    """Server instructions per script call, per row (callgrind)."""
    from _callgrind_redis import counted_redis  # only with --instructions

    with counted_redis() as server:
        rows = _rows(server.url, calls)
        counts = {name: server.instructions(run) for name, run in rows.items()}
    return {name: count / calls for name, count in counts.items()}


async def client_side(url: str, cycles: int) -> tuple[float, float]:
    """The p50 (µs) of an acquire + release cycle, and hold() cycles per second."""
    backend = RedisRateLimitBackend.from_url(url)
    limiter = ConcurrencyLimiter(POLICY, backend=backend, budget=5)
    await limiter.release(await limiter.acquire("warm"))
    laps = []
    for _ in range(cycles):
        start = time.perf_counter()
        await limiter.release(await limiter.acquire("client"))
        laps.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(cycles):
        async with limiter.hold("client"):
            pass
    rate = cycles / (time.perf_counter() - start)
    await backend.aclose()
    await backend.client.aclose()
    return statistics.median(laps) * 1e6, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--instructions", action="store_true")
    args = parser.parse_args()
    if args.instructions:
        calls = min(args.calls, 300)
        print(f"\nredis-server instructions per call (callgrind, {calls} calls each)\n")
        for name, count in instructions(calls).items():
            print(f"| {name} | {count:,.0f} |")
        return
    with private_redis() as url:
        print(f"\nserver µs per script call (median of {args.rounds} rounds, {args.calls} each)\n")
        for name, usec in server_time(url, args.rounds, args.calls).items():
            print(f"| {name} | {usec:.2f} |")
        p50, rate = asyncio.run(client_side(url, args.calls))
        print(f"\nasync acquire + release p50 {p50:.0f} µs; hold() {rate:,.0f} cycles/s")


if __name__ == "__main__":
    main()
