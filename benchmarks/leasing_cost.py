"""Where a leased decision's time goes: the in-process parts, and a lease call's cost.

    PYTHONPATH=. uv run --group bench python benchmarks/leasing_cost.py [--rounds 7]

In process (no I/O; a lease that never runs out): ``RateLimiter.hit`` and
``SyncRateLimiter.hit`` answered from a lease, and the ``Decision`` they return built
three ways: the dataclasses' own constructors, ``decision_from_reply`` (the per-decision
path's builder), and ``admitted`` (the leased path's). Over a private throw-away
``redis-server``: one lease call (``lua/ratelimit/lease.lua``) made back to back, the
same call after 128 in-process decisions (how the leased path meets it), and one
per-decision call (the limiter's fast path) back to back. Rounds interleaved; medians
of per-round means (ns per operation).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from headway import (
    Decision,
    FixedWindow,
    Leasing,
    PolicyDecision,
    RateLimiter,
    RedisRateLimitBackend,
    Source,
    SyncRateLimiter,
)
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.decision import admitted, decision_from_reply

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests
from tests.servers import private_redis

POLICY = FixedWindow(10**7, 60.0)
FOREVER = Leasing(chunk=10**6, share=1.0, hold=60.0)


def _in_process(n: int) -> dict[str, Callable[[], Awaitable[float]]]:
    limiter = RateLimiter(POLICY, lease=FOREVER)
    sync_limiter = SyncRateLimiter(POLICY, lease=FOREVER)

    async def hit() -> float:
        await limiter.hit("hot")
        started = time.perf_counter_ns()
        for _ in range(n):
            await limiter.hit("hot")
        return (time.perf_counter_ns() - started) / n

    async def sync_hit() -> float:
        sync_limiter.hit("hot")
        started = time.perf_counter_ns()
        for _ in range(n):
            sync_limiter.hit("hot")
        return (time.perf_counter_ns() - started) / n

    async def constructors() -> float:
        started = time.perf_counter_ns()
        for _ in range(n):
            part = PolicyDecision(POLICY, True, 5, 1.0, 0.0)
            Decision(True, POLICY.limit, 5, 1.0, 0.0, POLICY, Source.BACKEND, (part,))
        return (time.perf_counter_ns() - started) / n

    async def from_reply() -> float:
        reply, policies = (1, 1, 5, 1_000_000, 0), PolicySet([POLICY])
        started = time.perf_counter_ns()
        for _ in range(n):
            decision_from_reply(reply, policies)
        return (time.perf_counter_ns() - started) / n

    async def leased_builder() -> float:
        started = time.perf_counter_ns()
        for _ in range(n):
            admitted(POLICY, 5, 1.0)
        return (time.perf_counter_ns() - started) / n

    return {
        "RateLimiter.hit from a lease": hit,
        "SyncRateLimiter.hit from a lease": sync_hit,
        "Decision: dataclass constructors": constructors,
        "Decision: decision_from_reply": from_reply,
        "Decision: admitted (leased path)": leased_builder,
    }


def _calls(backend: RedisRateLimitBackend, n: int) -> dict[str, Callable[[], Awaitable[float]]]:
    policies, leasing = PolicySet([POLICY]), Leasing()

    async def lease(after: int) -> float:
        spent = 0
        for _ in range(n):
            if after:  # what the leased path does between two lease calls
                limiter = RateLimiter(POLICY, lease=FOREVER)
                for _ in range(after):
                    await limiter.hit("local")
            started = time.perf_counter_ns()
            await backend.lease("hot", policies, 1, leasing)
            spent += time.perf_counter_ns() - started
        return spent / n

    fast = backend._fast_path()  # what ``RateLimiter`` calls per decision
    assert fast is not None

    async def submit() -> float:
        started = time.perf_counter_ns()
        for _ in range(n):
            future = fast.submit("hot", policies, 1, False, 1.0)
            assert isinstance(future, asyncio.Future)
            fast.read(await future, policies)
        return (time.perf_counter_ns() - started) / n

    return {
        "lease call, back to back": lambda: lease(0),
        "lease call, after 128 decisions in process": lambda: lease(128),
        "per-decision call (fast path), back to back": submit,
    }


async def run(rounds: int) -> None:
    results: dict[str, list[float]] = {}
    with private_redis() as url:
        backend = RedisRateLimitBackend.from_url(url)
        await backend.decide("warm", PolicySet([POLICY]), 1, False)
        await backend.lease("warm", PolicySet([POLICY]), 1, Leasing())
        contenders = {**_in_process(100_000), **_calls(backend, 500)}
        for _ in range(rounds):
            for name, measure in contenders.items():
                results.setdefault(name, []).append(await measure())
        await backend.aclose()
        await backend.client.aclose()
    print(f"\n{rounds} rounds; median of per-round means\n")
    print("| operation | ns |")
    print("|---|--:|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values):,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    asyncio.run(run(parser.parse_args().rounds))


if __name__ == "__main__":
    main()
