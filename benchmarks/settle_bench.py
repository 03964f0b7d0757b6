"""Reserve, then settle, against a plain decision: round trips and p50 latency, on Redis.

    PYTHONPATH=. uv run --group bench python benchmarks/settle_bench.py [--rounds 5 --calls 5000]

One process, one key per contender with a quota never reached (every call admitted),
operations made one after another on ``RateLimiter(FixedWindow, TokenBucket,
metered=[tokens])`` over ``RedisRateLimitBackend`` (an LLM endpoint's requests and tokens
per minute): ``hit`` (a plain decision, cost 1 on both policies), ``reserve`` then
``settle`` at another cost (a refund: two script calls), and ``reserve`` then ``settle``
at the estimate (no settle call). The benchmark starts its own throw-away
``redis-server``; after ``CONFIG RESETSTAT`` it reads ``INFO commandstats`` for the
script calls (headway's round trips: it sends nothing else). Rounds are interleaved
(every contender once per round); medians over rounds. p50 is every operation timed alone
(``perf_counter_ns``), and each step of it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis

from headway import FixedWindow, RateLimiter, RedisRateLimitBackend, TokenBucket

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests
from tests.servers import private_redis

HIGH = 10**7  # per minute: never reached here
REQUESTS = FixedWindow(HIGH, 60.0)
TOKENS = TokenBucket(HIGH, HIGH, 60.0)
#: name -> one operation on the limiter: returns the time (ns) of each of its steps.
Operation = Callable[[RateLimiter, str], Awaitable[list[int]]]


async def _hit(limiter: RateLimiter, key: str) -> list[int]:
    started = time.perf_counter_ns()
    assert (await limiter.hit(key)).allowed
    return [time.perf_counter_ns() - started]


async def _reserve_settle(limiter: RateLimiter, key: str, actual: int) -> list[int]:
    started = time.perf_counter_ns()
    reservation = await limiter.reserve(key, 500)
    reserved = time.perf_counter_ns()
    assert reservation
    assert await limiter.settle(reservation, actual)
    return [reserved - started, time.perf_counter_ns() - reserved]


CONTENDERS: dict[str, Operation] = {
    "hit (plain decision)": _hit,
    "reserve + settle (refund)": lambda limiter, key: _reserve_settle(limiter, key, 180),
    "reserve + settle at the estimate": lambda limiter, key: _reserve_settle(limiter, key, 500),
}


def _script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha", "eval")
    )


async def measure(name: str, url: str, calls: int) -> dict[str, float]:
    backend = RedisRateLimitBackend.from_url(url)
    limiter = RateLimiter(REQUESTS, TOKENS, backend=backend, metered=[TOKENS])
    operation = CONTENDERS[name]
    key = f"bench-{name}-{time.monotonic_ns()}"  # a fresh quota each round
    await operation(limiter, key)  # connected, scripts loaded
    admin = redis.Redis.from_url(url)
    admin.config_resetstat()
    steps = [await operation(limiter, key) for _ in range(calls)]
    scripts = _script_calls(admin)
    admin.close()
    await backend.aclose()
    await backend.client.aclose()
    result = {
        "round trips per op": scripts / calls,
        "p50 op (us)": statistics.median(sum(s) for s in steps) / 1000,
    }
    if len(steps[0]) == 2:
        result["p50 reserve (us)"] = statistics.median(s[0] for s in steps) / 1000
        result["p50 settle (us)"] = statistics.median(s[1] for s in steps) / 1000
    return result


async def run(rounds: int, calls: int) -> None:
    results: dict[str, list[dict[str, float]]] = {}
    with private_redis() as url:
        for _ in range(rounds):
            for name in CONTENDERS:
                results.setdefault(name, []).append(await measure(name, url, calls))
    print(f"{rounds} rounds x {calls} operations, medians over rounds")
    print("| operation | round trips per op | p50 op (us) | p50 reserve (us) | p50 settle (us) |")
    print("| --- | --- | --- | --- | --- |")
    for name, per_round in results.items():
        cells = []
        for column in ("round trips per op", "p50 op (us)", "p50 reserve (us)", "p50 settle (us)"):
            values = [r[column] for r in per_round if column in r]
            cells.append(f"{statistics.median(values):.2f}" if values else "-")
        print(f"| {name} | {' | '.join(cells)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    asyncio.run(run(args.rounds, args.calls))


if __name__ == "__main__":
    main()
