"""Concurrency slots on Redis: TTLs, hostile keys, outages; the sync shell; the model."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis import asyncio as aioredis

from headway import (
    Concurrency,
    ConcurrencyLimiter,
    RedisRateLimitBackend,
    Source,
    SyncConcurrencyLimiter,
    SyncMemoryRateLimitBackend,
    SyncRedisRateLimitBackend,
)
from headway._errors import BackendUnavailable, ConcurrencyLimitExceeded, LockNotOwned
from headway.lock.driver import run_to_end
from headway.ratelimit.policies import OnError
from tests.servers import free_port

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


async def _stored(client: aioredis.Redis) -> list[str]:
    return [k.decode() if isinstance(k, bytes) else k for k in await client.keys("*")]


async def test_slot_keys_have_a_ttl_and_vanish_when_released(
    redis_client: aioredis.Redis,
) -> None:
    limiter = ConcurrencyLimiter(
        Concurrency(3, ttl=5.0), backend=RedisRateLimitBackend(redis_client)
    )
    admissions = [await limiter.acquire("k") for _ in range(3)]
    (key,) = await _stored(redis_client)
    assert key == "headway:{rl:k}:cc3"
    assert 4000 < await redis_client.pttl(key) <= 5000
    # Each lease ends ttl after it was granted, by the server's clock.
    seconds, micros = await redis_client.time()
    now = int(seconds) * 1_000_000 + int(micros)
    leases = await redis_client.zrange(key, 0, -1, withscores=True)
    assert all(now < float(lease[1]) <= now + 5_000_000 for lease in leases)
    # A renewal keeps the key alive at least as long as the renewed lease.
    assert admissions[0].slot is not None
    await limiter.extend(admissions[0].slot, ttl=60.0)
    assert 59_000 < await redis_client.pttl(key) <= 60_000
    for admission in admissions:
        assert await limiter.release(admission)
    assert await _stored(redis_client) == []


async def test_hostile_keys_share_one_tag_and_never_collide(
    redis_client: aioredis.Redis,
) -> None:
    limiter = ConcurrencyLimiter(Concurrency(1), backend=RedisRateLimitBackend(redis_client))
    hostile = ["a{b}c", "}{", "x:y:z", "", " ", "é" * 40, "k" * 1_000_000, "a{b}c "]
    for key in hostile:
        assert (await limiter.acquire(key)).allowed, key
    for key in hostile:
        assert not (await limiter.acquire(key)).allowed, key
    stored = await _stored(redis_client)
    assert len(stored) == len(hostile)
    assert all(len(k) < 100 and k.count("{") == 1 and k.count("}") == 1 for k in stored)
    assert all([await redis_client.pttl(k) > 0 for k in stored])


@pytest.mark.parametrize(
    ("on_error", "source"), [("allow", Source.FAILED_OPEN), ("deny", Source.FAILED_CLOSED)]
)
async def test_redis_down_fails_as_the_policy_says(on_error: OnError, source: Source) -> None:
    backend = RedisRateLimitBackend.from_url(f"redis://127.0.0.1:{free_port()}/0")
    limiter = ConcurrencyLimiter(
        Concurrency(1, on_error=on_error), backend=backend, retry_on_error=2.0
    )
    admission = await limiter.acquire("k")
    assert admission.source is source
    assert admission.failed
    assert admission.slot is None
    assert admission.allowed is (on_error == "allow")
    assert admission.retry_after == (0.0 if on_error == "allow" else 2.0)
    if on_error == "allow":
        ran = False
        async with limiter.hold("k") as held:
            ran = True
            assert held.source is Source.FAILED_OPEN
        assert ran
    else:
        with pytest.raises(ConcurrencyLimitExceeded) as refused:
            async with limiter.hold("k"):
                pytest.fail("the block ran")
        assert refused.value.admission.failed
    await backend.client.aclose()

    sync = SyncRedisRateLimitBackend.from_url(f"redis://127.0.0.1:{free_port()}/0")
    assert SyncConcurrencyLimiter(limiter.policy, backend=sync).acquire("k").source is source
    sync.client.close()


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_the_sync_shell(kind: str, sync_redis_client: redis.Redis) -> None:
    backend = (
        SyncMemoryRateLimitBackend()
        if kind == "memory"
        else SyncRedisRateLimitBackend(sync_redis_client)
    )
    limiter = SyncConcurrencyLimiter(Concurrency(2, ttl=5.0), backend=backend)
    first, second, third = (limiter.acquire("k") for _ in range(3))
    assert (first.allowed, second.allowed, third.allowed) == (True, True, False)
    assert third.in_flight == 2
    assert limiter.release(first)
    with pytest.raises(ZeroDivisionError), limiter.hold("k"):
        _ = 1 / 0
    with limiter.hold("k") as held:
        assert held.in_flight == 2
        with pytest.raises(ConcurrencyLimitExceeded), limiter.hold("k"):
            pytest.fail("the block ran")
    assert second.slot is not None
    assert limiter.extend(second.slot).deadline > second.slot.deadline
    assert limiter.release(second)
    assert not limiter.release(second)
    with pytest.raises(LockNotOwned):
        limiter.extend(second.slot)


async def test_the_scripts_match_the_model(sync_redis_client: redis.Redis) -> None:
    """The same sequence of acquires and releases gets the same grants from both."""
    policies = [Concurrency(1), Concurrency(3)]
    remote = SyncRedisRateLimitBackend(sync_redis_client)
    model = SyncMemoryRateLimitBackend()
    tokens: dict[tuple[str, int], list[str]] = {}
    for step in range(200):
        key, policy = f"k{step % 3}", policies[step % 2]
        held = tokens.setdefault((key, policy.limit), [])
        if step % 5 in (1, 3) and held:
            token = held.pop((step * 7) % len(held))
            assert remote.release_slot(key, policy, token) == model.release_slot(key, policy, token)
        token = f"t{step}"
        theirs, ours = (
            remote.acquire_slot(key, policy, token),
            model.acquire_slot(key, policy, token),
        )
        assert (theirs.granted, theirs.in_flight) == (ours.granted, ours.in_flight)
        if ours.granted:
            held.append(token)


async def test_complete_reraises_the_callers_cancellation_when_the_call_fails() -> None:
    gate = asyncio.Event()

    async def call() -> None:
        await gate.wait()
        raise BackendUnavailable("down", backend="test")

    task = asyncio.create_task(run_to_end(call()))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
