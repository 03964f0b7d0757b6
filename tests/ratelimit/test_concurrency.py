"""Exactness under real concurrency: 1,000 simultaneous hits, admissions counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
from redis import asyncio as aioredis

from headway import (
    FakeClock,
    FixedWindow,
    LeakyBucket,
    RateLimiter,
    RedisRateLimitBackend,
    SlidingCounter,
    SlidingLog,
    SyncMemoryRateLimitBackend,
    TokenBucket,
)
from headway.ratelimit.policies import Policy
from tests.ratelimit.strategies import EPOCH_US, set_us

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

WINDOWS = [FixedWindow(100, 1.0), SlidingLog(100, 1.0), SlidingCounter(100, 1.0)]
BUCKETS = [TokenBucket(100, 100, 1.0), LeakyBucket(100, 100, 1.0)]


@pytest.fixture
async def pooled(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    pool = aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=64)
    client = aioredis.Redis.from_pool(pool)
    await client.flushdb()
    try:
        yield client
    finally:
        await client.aclose()


async def _waves(
    client: aioredis.Redis, policy: Policy, waves: Sequence[tuple[int, int]]
) -> tuple[int, int]:
    """Run each wave's hits concurrently at one injected time; count admissions.

    Returns what Redis admitted and what the model admits for the same waves.
    """
    clock = FakeClock()
    backend = RedisRateLimitBackend(client, clock=clock)
    model = SyncMemoryRateLimitBackend(clock=clock)
    admitted = expected = 0
    for now, hits in waves:
        set_us(clock, now)
        verdicts = await asyncio.gather(
            *(backend.decide("hot", [policy], 1, False) for _ in range(hits))
        )
        admitted += sum(v.allowed for v in verdicts)
        expected += sum(model.decide("hot", [policy], 1, False).allowed for _ in range(hits))
    return admitted, expected


@pytest.mark.parametrize("policy", WINDOWS, ids=lambda p: p.name)
async def test_a_thousand_hits_in_one_window_admit_exactly_the_limit(
    pooled: aioredis.Redis, policy: Policy
) -> None:
    assert await _waves(pooled, policy, [(EPOCH_US + 123_456, 1000)]) == (100, 100)


@pytest.mark.parametrize(
    ("policy", "expected"),
    # 500 just before a boundary, 500 a quarter window after it.
    [(WINDOWS[0], 200), (WINDOWS[1], 100), (WINDOWS[2], 125)],
    ids=lambda p: getattr(p, "name", str(p)),
)
async def test_a_thousand_hits_straddling_a_boundary(
    pooled: aioredis.Redis, policy: Policy, expected: int
) -> None:
    boundary = EPOCH_US + 7_000_000
    waves = [(boundary - 1, 500), (boundary + 250_000, 500)]
    assert await _waves(pooled, policy, waves) == (expected, expected)


@pytest.mark.parametrize("policy", BUCKETS, ids=lambda p: p.name)
async def test_buckets_admit_capacity_plus_refill(pooled: aioredis.Redis, policy: Policy) -> None:
    # Ten waves of 100 concurrent hits, 10 ms apart: 100 + 9 refilled units, never more.
    waves = [(EPOCH_US + i * 10_000, 100) for i in range(10)]
    assert await _waves(pooled, policy, waves) == (109, 109)


async def _server_us(client: aioredis.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1_000_000 + int(micros)


@pytest.mark.parametrize("policy", [*WINDOWS, *BUCKETS], ids=lambda p: p.name)
async def test_a_real_burst_on_the_server_clock(pooled: aioredis.Redis, policy: Policy) -> None:
    # Real TIME, real concurrency. Window algorithms get a long window; if the
    # burst still crossed a fixed boundary, it is run again on a fresh key.
    if not isinstance(policy, TokenBucket | LeakyBucket):
        policy = type(policy)(100, 30.0)
    limiter = RateLimiter(policy, backend=RedisRateLimitBackend(pooled), budget=30)
    for attempt in range(3):
        start = await _server_us(pooled)
        decisions = await asyncio.gather(*(limiter.hit(f"burst{attempt}") for _ in range(1000)))
        end = await _server_us(pooled)
        admitted = sum(d.allowed for d in decisions)
        if isinstance(policy, TokenBucket | LeakyBucket):
            refill = (end - start) // policy.interval_us + 1
            assert 100 <= admitted <= 100 + refill
            return
        window = policy.window_us
        if start // window == end // window:
            assert admitted == 100
            return
    pytest.fail("every burst crossed a window boundary")
