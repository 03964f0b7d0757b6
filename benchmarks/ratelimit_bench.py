"""Rate-limit decisions: headway side by side with limits, throttled-py and pyrate-limiter.

    uv run --group bench python benchmarks/ratelimit_bench.py [--quick] [--url URL]

Every contender decides against the same Redis (DB 8 by default, flushed
before each measurement) through a ``redis.asyncio`` client, in one process,
one contender at a time. The floor is an EVALSHA of ``return 1`` through the
very client headway uses: no library can decide in less than one round trip.

headway runs with its defaults (coalescing on) unless a row says otherwise.
Scenarios: ``hot`` (one key, generous quota: everything admitted), ``distinct``
(10,000 keys in turn), ``rejected`` (one key, 10 per hour: nearly all refused).
For each: decision latency (one call at a time: p50, p99) and throughput
(``--workers`` tasks calling concurrently). Rounds are interleaved (every
contender once per round) and the medians over rounds are reported, so noise
from a busy machine hits everyone alike.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from redis import asyncio as aioredis

from headway import (
    FixedWindow,
    LeakyBucket,
    RateLimiter,
    RedisRateLimitBackend,
    SlidingCounter,
    SlidingLog,
    Source,
    TokenBucket,
)
from headway._redis.scripts import Script
from headway._redis.wire import Wires
from headway.ratelimit.policies import Policy

Decide = Callable[[str], Awaitable[bool]]
Close = Callable[[], Awaitable[None]]
#: Builds a contender's decide function for a scenario on a client; returns it and a closer.
Factory = Callable[["Scenario", aioredis.Redis, str], Awaitable[tuple[Decide, Close]]]

HIGH = 100_000  # per second: the "hot" and "distinct" quota, never reached here
LOW = 10  # per hour: the "rejected" quota


@dataclass(frozen=True)
class Scenario:
    name: str
    keys: int  # distinct keys used in turn
    generous: bool  # HIGH per second, else LOW per hour

    def key(self, i: int) -> str:
        return "hot" if self.keys == 1 else f"user-{i % self.keys}"


SCENARIOS = [
    Scenario("hot", 1, True),
    Scenario("distinct", 10_000, True),
    Scenario("rejected", 1, False),
]


async def _noop() -> None:
    return None


# --- the floor -------------------------------------------------------------------------


async def floor(scenario: Scenario, client: aioredis.Redis, url: str) -> tuple[Decide, Close]:
    sha = await client.script_load("return 1")

    async def decide(key: str) -> bool:
        return bool(await client.evalsha(sha, 1, key))

    return decide, _noop


async def wire_floor(scenario: Scenario, client: aioredis.Redis, url: str) -> tuple[Decide, Close]:
    """The same EVALSHA on the pipelined connection headway drives (``headway._redis.wire``)."""
    wires = Wires(client)
    noop = Script.from_source("noop", "return 1")

    async def decide(key: str) -> bool:
        return bool(await wires.call(noop, [key], []))

    return decide, wires.aclose


# --- headway -------------------------------------------------------------------------


def _headway(*make: Callable[[bool], Policy], cache: bool = False, **options: Any) -> Factory:
    async def factory(scenario: Scenario, client: aioredis.Redis, url: str) -> tuple[Decide, Close]:
        policies = [m(scenario.generous) for m in make]
        limiter = RateLimiter(
            *policies,
            backend=RedisRateLimitBackend(client, **options),
            budget=5.0,
            cache_blocked=cache,
        )

        async def decide(key: str) -> bool:
            decision = await limiter.hit(key)
            assert decision.source in (Source.BACKEND, Source.CACHE), decision
            return decision.allowed

        return decide, _noop

    return factory


def token_bucket(generous: bool) -> Policy:
    return TokenBucket(HIGH, HIGH, 1.0) if generous else TokenBucket(LOW, LOW, 3600.0)


def leaky_bucket(generous: bool) -> Policy:
    return LeakyBucket(HIGH, HIGH, 1.0) if generous else LeakyBucket(LOW, LOW, 3600.0)


def fixed_window(generous: bool) -> Policy:
    return FixedWindow(HIGH, 1.0) if generous else FixedWindow(LOW, 3600.0)


def sliding_log(generous: bool) -> Policy:
    return SlidingLog(HIGH, 1.0) if generous else SlidingLog(LOW, 3600.0)


def sliding_counter(generous: bool) -> Policy:
    return SlidingCounter(HIGH, 1.0) if generous else SlidingCounter(LOW, 3600.0)


def per_minute(generous: bool) -> Policy:
    return FixedWindow(60 * HIGH, 60.0) if generous else FixedWindow(60 * LOW, 60.0)


def per_hour(generous: bool) -> Policy:
    return SlidingCounter(HIGH, 3600.0) if generous else SlidingCounter(LOW * 2, 3600.0)


# --- limits ---------------------------------------------------------------------------


def _limits(strategy: str) -> Factory:
    async def factory(scenario: Scenario, client: aioredis.Redis, url: str) -> tuple[Decide, Close]:
        from limits import RateLimitItemPerHour, RateLimitItemPerSecond
        from limits.aio import strategies
        from limits.aio.storage import RedisStorage

        pool: Any = client.connection_pool
        storage = RedisStorage("async+" + url, implementation="redispy", connection_pool=pool)
        limiter = getattr(strategies, strategy)(storage)
        item = RateLimitItemPerSecond(HIGH) if scenario.generous else RateLimitItemPerHour(LOW)

        async def decide(key: str) -> bool:
            return bool(await limiter.hit(item, key))

        return decide, _noop

    return factory


# --- throttled-py ---------------------------------------------------------------------


def _throttled(using: str) -> Factory:
    async def factory(scenario: Scenario, client: aioredis.Redis, url: str) -> tuple[Decide, Close]:
        from throttled.asyncio import RedisStore, Throttled, per_hour, per_sec

        store = RedisStore(server=url)
        quota = per_sec(HIGH, burst=HIGH) if scenario.generous else per_hour(LOW, burst=LOW)
        throttle = Throttled(using=using, quota=quota, store=store, timeout=-1)

        async def decide(key: str) -> bool:
            return not (await throttle.limit(key)).limited

        async def close() -> None:
            client: Any = store._backend.get_client()
            await client.aclose()

        return decide, close

    return factory


# --- pyrate-limiter -------------------------------------------------------------------


async def pyrate(scenario: Scenario, client: aioredis.Redis, url: str) -> tuple[Decide, Close]:
    from pyrate_limiter import BucketFactory, Duration, Limiter, Rate, RateItem, RedisBucket
    from pyrate_limiter.buckets.redis_bucket import LuaScript

    rate = Rate(HIGH, Duration.SECOND) if scenario.generous else Rate(LOW, Duration.HOUR)
    sha = await client.script_load(LuaScript.PUT_ITEM)

    class PerKey(BucketFactory):
        """One RedisBucket per key (its own factory serves one bucket for all names)."""

        def __init__(self) -> None:
            self.buckets: dict[str, RedisBucket] = {}
            self.clock = RedisBucket([rate], client, "pyrate:clock", sha)

        def wrap_item(self, name: str, weight: int = 1) -> RateItem:
            return RateItem(name, self.clock.now(), weight=weight)  # type: ignore[no-untyped-call]

        def get(self, item: RateItem) -> RedisBucket:
            bucket = self.buckets.get(item.name)
            if bucket is None:
                bucket = self.buckets[item.name] = RedisBucket([rate], client, item.name, sha)
            return bucket

    limiter = Limiter(PerKey())

    async def decide(key: str) -> bool:
        return bool(await limiter.try_acquire_async(key, blocking=False))

    return decide, _noop


WIRE_FLOOR = "floor on headway's connection"
CONTENDERS: dict[str, Factory] = {
    "floor: EVALSHA return 1": floor,
    WIRE_FLOOR: wire_floor,
    "headway TokenBucket (GCRA)": _headway(token_bucket),
    "headway LeakyBucket": _headway(leaky_bucket),
    "headway FixedWindow": _headway(fixed_window),
    "headway SlidingLog": _headway(sliding_log),
    "headway SlidingCounter": _headway(sliding_counter),
    "headway 3 policies": _headway(token_bucket, per_minute, per_hour),
    "headway 3 policies, cache_blocked": _headway(token_bucket, per_minute, per_hour, cache=True),
    "headway TokenBucket, own_connection=False": _headway(token_bucket, own_connection=False),
    "headway 3 policies, own_connection=False": _headway(
        token_bucket, per_minute, per_hour, own_connection=False
    ),
    "limits fixed window": _limits("FixedWindowRateLimiter"),
    "limits moving window": _limits("MovingWindowRateLimiter"),
    "limits sliding window counter": _limits("SlidingWindowCounterRateLimiter"),
    "throttled-py fixed_window": _throttled("fixed_window"),
    "throttled-py sliding_window": _throttled("sliding_window"),
    "throttled-py token_bucket": _throttled("token_bucket"),
    "throttled-py leaking_bucket": _throttled("leaking_bucket"),
    "throttled-py gcra": _throttled("gcra"),
    "pyrate-limiter RedisBucket": pyrate,
}


# --- measuring ------------------------------------------------------------------------


@dataclass
class Result:
    p50: list[float] = field(default_factory=list)  # µs, one per round
    p99: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)  # decisions per second
    admitted: list[float] = field(default_factory=list)  # share admitted


async def latency(decide: Decide, scenario: Scenario, n: int) -> tuple[float, float, float]:
    samples = []
    admitted = 0
    clock = time.perf_counter_ns
    for i in range(n):
        key = scenario.key(i)
        start = clock()
        admitted += await decide(key)
        samples.append(clock() - start)
    samples.sort()
    return samples[n // 2] / 1000, samples[n * 99 // 100] / 1000, admitted / n


async def throughput(decide: Decide, scenario: Scenario, n: int, workers: int) -> float:
    per_worker = n // workers

    async def worker(w: int) -> None:
        for i in range(per_worker):
            await decide(scenario.key(w * per_worker + i))

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    return per_worker * workers / (time.perf_counter() - start)


async def measure(
    name: str, scenario: Scenario, url: str, args: argparse.Namespace
) -> tuple[float, float, float, float]:
    client = aioredis.Redis.from_url(url)
    try:
        await client.flushdb()
        decide, close = await CONTENDERS[name](scenario, client, url)
        for i in range(args.warmup):  # connections, scripts, and the rejected key's quota
            await decide(scenario.key(i))
        gc.collect()
        p50, p99, admitted = await latency(decide, scenario, args.calls)
        rate = await throughput(decide, scenario, args.calls, args.workers)
        await close()
        return p50, p99, rate, admitted
    finally:
        await client.flushdb()
        await client.aclose()


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(results: dict[tuple[str, str], Result], args: argparse.Namespace) -> None:
    print(
        f"\n{args.rounds} round(s) x {args.calls} calls; throughput with {args.workers} tasks; "
        "medians over rounds\n"
    )
    for scenario in args.scenarios:
        base = results.get(("floor: EVALSHA return 1", scenario))
        own = results.get((WIRE_FLOOR, scenario))
        print(f"### {scenario}\n")
        print(
            "| contender | p50 µs | p99 µs | p50 / floor | p50 / floor on headway's connection "
            "| decisions/s | vs floor | admitted |"
        )
        print("|---|--:|--:|--:|--:|--:|--:|--:|")
        for name in args.contenders:
            r = results.get((name, scenario))
            if r is None:
                continue
            p50, p99, rate = _median(r.p50), _median(r.p99), _median(r.rate)
            vs_p50 = f"{p50 / _median(base.p50):.2f}x" if base else "-"
            vs_own = f"{p50 / _median(own.p50):.2f}x" if own else "-"
            vs_rate = f"{rate / _median(base.rate):.0%}" if base else "-"
            share = f"{_median(r.admitted):.0%}"
            print(
                f"| {name} | {p50:.0f} | {p99:.0f} | {vs_p50} | {vs_own} | {rate:,.0f} | {vs_rate} "
                f"| {share} |"
            )
        print()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/8")
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--calls", type=int)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--only", default="", help="contenders whose name contains this")
    parser.add_argument("--scenario", action="append", dest="scenarios")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.calls = args.calls or (1_000 if args.quick else 3_000)
    args.warmup = 200
    args.scenarios = args.scenarios or [s.name for s in SCENARIOS]
    names = [n for n in CONTENDERS if args.only.lower() in n.lower() or "floor" in n]
    args.contenders = names
    scenarios = {s.name: s for s in SCENARIOS}

    results: dict[tuple[str, str], Result] = {}
    for round_ in range(args.rounds):
        for scenario in args.scenarios:
            for name in names:
                try:
                    p50, p99, rate, admitted = await measure(
                        name, scenarios[scenario], args.url, args
                    )
                except Exception as exc:  # e.g. another user's SCRIPT FLUSH: once more
                    print(f"round {round_ + 1} {scenario} {name}: {exc!r}; measuring again")
                    p50, p99, rate, admitted = await measure(
                        name, scenarios[scenario], args.url, args
                    )
                r = results.setdefault((name, scenario), Result())
                r.p50.append(p50)
                r.p99.append(p99)
                r.rate.append(rate)
                r.admitted.append(admitted)
                print(
                    f"round {round_ + 1} {scenario:9} {name:36} p50 {p50:7.0f} µs "
                    f"p99 {p99:7.0f} µs {rate:9,.0f}/s",
                    flush=True,
                )
    report(results, args)


if __name__ == "__main__":
    asyncio.run(main())
