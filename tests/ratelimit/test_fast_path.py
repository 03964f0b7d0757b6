"""The limiter's private fast path: which backends offer it, and that Redis takes it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from redis import asyncio as aioredis

from headway import (
    Decision,
    FakeClock,
    FixedWindow,
    MemoryRateLimitBackend,
    Policy,
    RateLimiter,
    RedisRateLimitBackend,
    Source,
)
from headway.ratelimit.backends.fast_path import fast_path_of
from tests.ratelimit.toy_backend import DictBackend
from tests.windows import NO_ROLLOVER

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


async def test_only_the_builtin_backends_offer_a_fast_path(redis_client: aioredis.Redis) -> None:
    assert fast_path_of(MemoryRateLimitBackend()) is not None
    assert fast_path_of(RedisRateLimitBackend(redis_client)) is not None
    # Through redis-py, or on a clock of the caller's: every call is ``decide``.
    assert fast_path_of(RedisRateLimitBackend(redis_client, own_connection=False)) is None
    assert fast_path_of(RedisRateLimitBackend(redis_client, clock=FakeClock())) is None
    assert fast_path_of(DictBackend()) is None


async def test_a_ready_redis_connection_decides_without_decide(
    redis_client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RedisRateLimitBackend(redis_client)
    limiter = RateLimiter(FixedWindow(3, NO_ROLLOVER), backend=backend)
    assert (await limiter.hit("warm")).allowed  # the first call opens the connection

    async def tripwire(key: str, policies: Sequence[Policy], cost: int, peek: bool) -> Decision:
        raise AssertionError("the fast path was not taken")

    monkeypatch.setattr(backend, "decide", tripwire)
    decisions = [await limiter.hit("k") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True] * 3 + [False]
    assert {d.source for d in decisions} == {Source.BACKEND}
    assert (await limiter.peek("k")).remaining == 0
