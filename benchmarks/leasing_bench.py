"""Leased quota on a hot key: decisions per second, Redis round trips, in-process latency.

    PYTHONPATH=. uv run --group bench python benchmarks/leasing_bench.py [--rtt-ms 0.2]

One process, one key with a generous quota (every call admitted), ``--calls``
sequential decisions per contender: headway with ``lease=Leasing()`` (the default
chunk), headway's per-decision path (one script call each), the same two for
``SyncRateLimiter`` (a fixed window), and the peers users pick
today, limits and throttled-py (their Redis storages). The benchmark starts its own
throw-away ``redis-server`` (stopped by PID at the end); after ``CONFIG RESETSTAT`` it
reads ``INFO commandstats``: the script calls (headway's round trips: it sends nothing
else) and every command counted (commands run inside scripts included: the peers send
plain commands beside or instead of scripts).
``--rtt-ms`` puts a relay adding that round trip in front of it (``_delay_proxy.py``:
a Redis on another host). Rounds are interleaved (every contender once per round);
medians over rounds. The in-process latency is the median of every ``hit`` timed
alone (``perf_counter_ns``), lease calls included.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from middleware_bench import delayed

from headway import (
    FixedWindow,
    Leasing,
    RateLimiter,
    RedisRateLimitBackend,
    SyncRateLimiter,
    SyncRedisRateLimitBackend,
    TokenBucket,
)
from headway.ratelimit.policies import Policy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests
from tests.servers import private_redis

HIGH = 10**7  # per minute: never reached here
Decide = Callable[[str], Awaitable[bool]]
Factory = Callable[[str], tuple[Decide, Callable[[], Awaitable[None]]]]


def _fixed() -> Policy:
    return FixedWindow(HIGH, 60.0)


def _bucket() -> Policy:
    return TokenBucket(HIGH, HIGH, 60.0)


def _headway(policy: Callable[[], Policy], lease: Leasing | None) -> Factory:
    def factory(url: str) -> tuple[Decide, Callable[[], Awaitable[None]]]:
        backend = RedisRateLimitBackend.from_url(url)
        limiter = RateLimiter(policy(), backend=backend, lease=lease)

        async def decide(key: str) -> bool:
            return (await limiter.hit(key)).allowed

        async def close() -> None:
            await limiter.return_leases()
            await backend.aclose()
            await backend.client.aclose()

        return decide, close

    return factory


def _headway_sync(lease: Leasing | None) -> Factory:
    def factory(url: str) -> tuple[Decide, Callable[[], Awaitable[None]]]:
        backend = SyncRedisRateLimitBackend.from_url(url)
        limiter = SyncRateLimiter(_fixed(), backend=backend, lease=lease)

        async def decide(key: str) -> bool:
            return limiter.hit(key).allowed

        async def close() -> None:
            limiter.return_leases()
            backend.close()
            backend.client.close()

        return decide, close

    return factory


def _limits(url: str) -> tuple[Decide, Callable[[], Awaitable[None]]]:
    from limits import RateLimitItemPerMinute, strategies
    from limits.storage import RedisStorage

    limiter = strategies.FixedWindowRateLimiter(RedisStorage(url))
    item = RateLimitItemPerMinute(HIGH)

    async def decide(key: str) -> bool:
        return bool(limiter.hit(item, key))

    return decide, _nothing


def _throttled(url: str) -> tuple[Decide, Callable[[], Awaitable[None]]]:
    from throttled import RedisStore, Throttled, per_min

    store = RedisStore(server=url)
    throttle = Throttled(using="token_bucket", quota=per_min(HIGH, burst=HIGH), store=store)

    async def decide(key: str) -> bool:
        return not throttle.limit(key).limited

    return decide, _nothing


async def _nothing() -> None:
    return None


CONTENDERS: dict[str, Factory] = {
    "headway FixedWindow, leased": _headway(_fixed, Leasing()),
    "headway TokenBucket, leased": _headway(_bucket, Leasing()),
    "headway FixedWindow, per decision": _headway(_fixed, None),
    "headway TokenBucket, per decision": _headway(_bucket, None),
    "headway FixedWindow, leased (sync)": _headway_sync(Leasing()),
    "headway FixedWindow, per decision (sync)": _headway_sync(None),
    "limits fixed-window (sync)": _limits,
    "throttled-py token_bucket (sync)": _throttled,
}
#: Each leased row against its own per-decision path.
LEASED = {
    "headway FixedWindow, leased": "headway FixedWindow, per decision",
    "headway TokenBucket, leased": "headway TokenBucket, per decision",
    "headway FixedWindow, leased (sync)": "headway FixedWindow, per decision (sync)",
}


@dataclass
class Sample:
    per_second: float
    scripts: float  # script calls per 1,000 decisions
    commands: float  # every command the server counted (in scripts too), per 1,000
    p50_us: float
    admitted: float


def _commands(client: redis.Redis) -> tuple[int, int]:
    """(script calls, every command counted, the ones scripts ran included)."""
    stats = client.info("commandstats")
    counted = {
        name.removeprefix("cmdstat_"): int(s["calls"])
        for name, s in stats.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config", "cmdstat_flushdb"))
    }
    scripts = sum(counted.get(c, 0) for c in ("fcall", "evalsha", "eval"))
    return scripts, sum(counted.values())


async def measure(name: str, url: str, calls: int) -> Sample:
    admin = redis.Redis.from_url(url)
    admin.flushdb()
    decide, close = CONTENDERS[name](url)
    try:
        for _ in range(300):  # connections open, scripts loaded, first leases taken
            await decide("warm")
        admin.config_resetstat()
        latencies = []
        admitted = 0
        started = time.perf_counter()
        for _ in range(calls):
            before = time.perf_counter_ns()
            admitted += await decide("hot")
            latencies.append(time.perf_counter_ns() - before)
        elapsed = time.perf_counter() - started
        scripts, commands = _commands(admin)
    finally:
        await close()
        admin.flushdb()
        admin.close()
    p50_us = statistics.median(latencies) / 1000
    per_1000 = 1000 / calls
    return Sample(
        calls / elapsed, scripts * per_1000, commands * per_1000, p50_us, admitted / calls
    )


def _median(samples: list[Sample], attribute: str) -> float:
    return statistics.median(float(getattr(s, attribute)) for s in samples)


def report(results: dict[str, list[Sample]], rounds: int, calls: int) -> None:
    print(f"\n{rounds} round(s) x {calls} sequential decisions on one hot key; medians\n")
    print(
        "| contender | decisions/s | script calls / 1,000 | commands / 1,000 | p50 µs | admitted |"
    )
    print("|---|--:|--:|--:|--:|--:|")
    for name, samples in results.items():
        print(
            f"| {name} | {_median(samples, 'per_second'):,.0f} "
            f"| {_median(samples, 'scripts'):.1f} | {_median(samples, 'commands'):.1f} "
            f"| {_median(samples, 'p50_us'):.1f} | {_median(samples, 'admitted'):.0%} |"
        )
    print("\n| leased | per decision | speed-up |")
    print("|---|---|--:|")
    for leased, plain in LEASED.items():
        ratio = _median(results[leased], "per_second") / _median(results[plain], "per_second")
        print(f"| {leased} | {plain} | {ratio:.1f}x |")


async def run(rounds: int, calls: int, rtt_ms: float) -> None:
    results: dict[str, list[Sample]] = {}
    with private_redis() as direct, delayed(direct, rtt_ms) as url:
        for _ in range(rounds):
            for name in CONTENDERS:
                results.setdefault(name, []).append(await measure(name, url, calls))
    print(f"\nRedis round trip: loopback + {rtt_ms} ms")
    report(results, rounds, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument(
        "--rtt-ms", type=float, default=0.0, help="round trip added by a relay (a remote Redis)"
    )
    args = parser.parse_args()
    asyncio.run(run(args.rounds, args.calls, args.rtt_ms))


if __name__ == "__main__":
    main()
