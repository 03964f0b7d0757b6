"""Redis specifics: TTLs, hostile keys, NOSCRIPT, failure modes, the blocked-key cache."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest
import redis
from redis import asyncio as aioredis

from headway import (
    FixedWindow,
    LeakyBucket,
    RateLimiter,
    RedisRateLimitBackend,
    SlidingCounter,
    SlidingLog,
    Source,
    SyncRateLimiter,
    SyncRedisRateLimitBackend,
    TokenBucket,
)
from headway.ratelimit.backends.redis_scripts import state_keys
from headway.ratelimit.policies import OnError, Policy
from tests.redis_observed import commands_run
from tests.servers import Server, free_port
from tests.windows import NO_ROLLOVER

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

POLICIES = (
    TokenBucket(10, 5, 1.0),
    LeakyBucket(10, 5, 1.0),
    FixedWindow(10, 2.0),
    SlidingLog(10, 3.0),
    SlidingCounter(10, 4.0),
)


@pytest.fixture
async def own_client(own_server: Server) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(own_server.url)
    await client.flushall()  # our own throw-away server
    try:
        yield client
    finally:
        await client.aclose()


async def _stored(client: aioredis.Redis) -> list[str]:
    return [k.decode() if isinstance(k, bytes) else k for k in await client.keys("*")]


async def test_every_key_written_has_a_ttl(redis_client: aioredis.Redis) -> None:
    limiter = RateLimiter(*POLICIES, backend=RedisRateLimitBackend(redis_client))
    for cost in (1, 3, 2):
        assert (await limiter.hit("ttl", cost=cost)).allowed
    await limiter.peek("ttl")
    keys = sorted(await _stored(redis_client))
    assert keys == sorted(state_keys("ttl", POLICIES))
    # The TTLs: a refill or a leak from empty, a window, two windows (the log is renewed
    # once a window; the counter's current window weighs until the next one ends).
    bounds = {
        "tb": 10 * 200,
        "lb": 10 * 200,
        "fw": 2000,
        "sl": 6000,
        "sc": 8000,
    }
    # Policies kept in one string key: it lasts as long as the longest of them.
    assert [k.rsplit(":", 1)[1] for k in keys] == [
        "tb10r200000+lb10r200000+fw10w2000000+sl10w3000000+sc10w4000000",
        "tb10r200000+lb10r200000+fw10w2000000+sl10w3000000+sc10w4000000/sl10w3000000",
    ]
    assert 3000 < await redis_client.pttl(keys[0]) <= max(bounds.values())
    assert 2000 < await redis_client.pttl(keys[1]) <= bounds["sl"]
    for policy in POLICIES:  # alone, each policy's key lasts as long as its state matters
        limiter = RateLimiter(policy, backend=RedisRateLimitBackend(redis_client))
        assert (await limiter.hit("alone", cost=3)).allowed
        (key,) = state_keys("alone", [policy])
        assert 0 < await redis_client.pttl(key) <= bounds[policy.tag], key


async def test_a_logs_ttl_is_two_windows_renewed_once_it_covers_less_than_one(
    redis_client: aioredis.Redis,
) -> None:
    limiter = RateLimiter(SlidingLog(10, 10.0), backend=RedisRateLimitBackend(redis_client))
    (key,) = state_keys("log", [SlidingLog(10, 10.0)])
    assert (await limiter.hit("log")).allowed
    assert 19_000 < await redis_client.pttl(key) <= 20_000
    await redis_client.pexpire(key, 15_000)  # as if set 5 s ago: covers a window, kept
    assert (await limiter.hit("log")).allowed
    assert 14_000 < await redis_client.pttl(key) <= 15_000
    await redis_client.pexpire(key, 9000)  # less than a window left: renewed
    assert (await limiter.hit("log")).allowed
    assert 19_000 < await redis_client.pttl(key) <= 20_000


@pytest.mark.parametrize("policy", [TokenBucket(10, 1, 1.0), LeakyBucket(10, 1, 1.0)], ids=str)
async def test_a_buckets_ttl_is_kept_while_it_covers_the_state(
    redis_client: aioredis.Redis, policy: Policy
) -> None:
    """A bucket's key gets the time to refill from empty (10 s), kept while it covers the state."""
    limiter = RateLimiter(policy, backend=RedisRateLimitBackend(redis_client))
    (key,) = state_keys("keep", [policy])
    assert (await limiter.hit("keep")).allowed
    assert 9000 < await redis_client.pttl(key) <= 10_000
    await redis_client.pexpire(key, 5000)  # as if set 5 s ago
    assert (await limiter.hit("keep")).allowed  # the state matters ~2 s: the TTL covers it
    assert 4000 < await redis_client.pttl(key) <= 5000
    assert (await limiter.hit("keep", cost=5)).allowed  # ~7 s: it does not, set again
    assert 9000 < await redis_client.pttl(key) <= 10_000


async def test_several_policies_cost_one_read_and_one_write(own_client: aioredis.Redis) -> None:
    strings = [p for p in POLICIES if not isinstance(p, SlidingLog)]
    backend = RedisRateLimitBackend(own_client)
    # Two decisions, one charged: TIME and GET each, one SET; a sliding log keeps its zset.
    # Its TTL, set by the first charge, still covers a window: PTTL, no PEXPIRE. The
    # refusal prunes nothing: its oldest entry (a ZRANGE, the retry's too) is in the window.
    log = {"zremrangebyscore": 1, "zcard": 2, "zrange": 3, "zadd": 1, "pttl": 1}
    for policies, expected in [
        (strings, {"time": 2, "get": 2, "set": 1}),
        (POLICIES, {"time": 2, "get": 2, "set": 1, **log}),
    ]:
        limiter = RateLimiter(*policies, backend=backend)
        assert (await limiter.hit("k")).allowed
        await own_client.config_resetstat()
        assert (await limiter.hit("k")).allowed  # charges every policy
        assert not (await limiter.hit("k", cost=9)).allowed  # refused: nothing written
        stats = await own_client.info("commandstats")
        calls = {name[8:]: s["calls"] for name, s in stats.items() if name != "cmdstat_info"}
        calls.pop("config|resetstat")
        assert calls.pop("fcall") == 2
        assert calls == expected


async def test_hostile_keys_share_one_tag_and_never_collide(
    redis_client: aioredis.Redis,
) -> None:
    limiter = RateLimiter(
        FixedWindow(1, NO_ROLLOVER),
        SlidingLog(1, 60.0),
        backend=RedisRateLimitBackend(redis_client),
    )
    hostile = ["a{b}c", "}{", "x:y:z", "", " ", "é" * 40, "k" * 1_000_000, "a{b}c "]
    for key in hostile:
        assert (await limiter.hit(key)).allowed, key
    for key in hostile:
        assert not (await limiter.hit(key)).allowed, key
    stored = await _stored(redis_client)
    assert len(stored) == 2 * len(hostile)
    assert all(len(k) < 100 and k.count("{") == 1 and k.count("}") == 1 for k in stored)


async def test_a_flushed_library_is_loaded_again_on_the_same_call(
    own_client: aioredis.Redis,
) -> None:
    limiter = RateLimiter(*POLICIES, backend=RedisRateLimitBackend(own_client))
    assert (await limiter.hit("k")).source is Source.BACKEND
    await own_client.function_flush()
    decision = await limiter.hit("k")
    assert decision.source is Source.BACKEND
    assert decision.allowed
    assert decision.remaining == 8


@pytest.mark.parametrize(
    ("on_error", "source"), [("allow", Source.FAILED_OPEN), ("deny", Source.FAILED_CLOSED)]
)
async def test_redis_down_fails_as_each_policy_says(on_error: OnError, source: Source) -> None:
    backend = RedisRateLimitBackend.from_url(f"redis://127.0.0.1:{free_port()}/0")
    policies: list[Policy] = [FixedWindow(5, on_error="allow"), SlidingLog(5, on_error=on_error)]
    decision = await RateLimiter(*policies, backend=backend, retry_on_error=2.0).hit("k")
    assert decision.source is source
    assert decision.failed
    assert decision.allowed is (on_error == "allow")
    assert decision.retry_after == (0.0 if on_error == "allow" else 2.0)
    await backend.client.aclose()

    sync = SyncRedisRateLimitBackend.from_url(f"redis://127.0.0.1:{free_port()}/0")
    assert SyncRateLimiter(*policies, backend=sync).hit("k").source is source
    sync.client.close()


@pytest.mark.parametrize(
    ("on_error", "source"), [("allow", Source.FAILED_OPEN), ("deny", Source.FAILED_CLOSED)]
)
async def test_a_stalled_redis_answers_within_the_budget(
    own_server: Server, on_error: OnError, source: Source
) -> None:
    # No socket timeout: only the limiter's budget can end the call.
    client = aioredis.Redis.from_url(own_server.url)
    limiter = RateLimiter(
        TokenBucket(5, 1, on_error=on_error), backend=RedisRateLimitBackend(client), budget=0.2
    )
    assert (await limiter.hit("k")).source is Source.BACKEND
    os.kill(own_server.pid, signal.SIGSTOP)
    try:
        decision = await limiter.hit("k")
    finally:
        os.kill(own_server.pid, signal.SIGCONT)
    assert decision.source is source
    assert (await limiter.hit("k")).source is Source.BACKEND  # and it recovers
    await client.aclose()


async def _scripts_run(client: aioredis.Redis) -> int:
    """Script calls the server has processed (commands inside scripts are not counted)."""
    stats = await client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha", "eval")
    )


async def test_blocked_key_cache_spares_round_trips(own_client: aioredis.Redis) -> None:
    policy = FixedWindow(3, NO_ROLLOVER)
    cached = RateLimiter(policy, backend=RedisRateLimitBackend(own_client), cache_blocked=True)
    for _ in range(3):
        assert (await cached.hit("k")).allowed
    first = await cached.hit("k")
    assert not first.allowed
    assert first.source is Source.BACKEND

    before = await _scripts_run(own_client)
    answers = [await cached.hit("k", cost=c) for c in (1, 2, 3, 1)]
    assert await _scripts_run(own_client) - before == 0
    assert all(not d.allowed and d.source is Source.CACHE for d in answers)
    assert all(0 < d.retry_after <= first.retry_after for d in answers)

    # Without the cache every rejection is a round trip; another key is unaffected.
    plain = RateLimiter(policy, backend=RedisRateLimitBackend(own_client))
    before = await _scripts_run(own_client)
    for _ in range(4):
        assert (await plain.hit("k")).source is Source.BACKEND
    assert (await cached.hit("other")).allowed
    assert await _scripts_run(own_client) - before == 4 + 1

    await cached.reset("k")
    assert (await cached.hit("k")).allowed


async def test_concurrent_decisions_share_round_trips(
    own_client: aioredis.Redis, own_server: Server
) -> None:
    backend = RedisRateLimitBackend(own_client)  # coalescing is the default
    policies = FixedWindow(100, NO_ROLLOVER), SlidingLog(150, 60.0)
    limiter = RateLimiter(*policies, backend=backend, budget=30)
    await limiter.hit("warm")  # a connection, and the script cached
    wire = backend._wires.wire()
    writes = wire.writes
    before = await _scripts_run(own_client)
    decisions = await asyncio.gather(*(limiter.hit("k") for _ in range(500)))
    assert {d.source for d in decisions} == {Source.BACKEND}
    assert sum(d.allowed for d in decisions) == 100
    assert sorted(d.remaining for d in decisions if d.allowed) == list(range(100))
    assert await _scripts_run(own_client) - before == 500  # each decided once, no more
    # The wire's private count, the only one: the server's reads (INFO stats) split and
    # merge a client's writes.
    assert wire.writes - writes <= 10  # 500 calls made in one loop turn: a few writes

    plain = RedisRateLimitBackend(own_client, own_connection=False)
    before_plain = commands_run(own_server.url)
    assert (await RateLimiter(FixedWindow(100, NO_ROLLOVER), backend=plain).hit("other")).allowed
    ran = commands_run(own_server.url) - before_plain
    assert (ran["fcall"], ran["evalsha"] + ran["eval"]) == (0, 1)  # through redis-py


async def test_a_flushed_library_inside_a_pipeline_is_loaded_again(
    own_client: aioredis.Redis,
) -> None:
    backend = RedisRateLimitBackend(own_client)
    limiter = RateLimiter(FixedWindow(100, NO_ROLLOVER), backend=backend, budget=30)
    await limiter.hit("warm")
    await own_client.function_flush()
    decisions = await asyncio.gather(*(limiter.hit("k") for _ in range(300)))
    assert {d.source for d in decisions} == {Source.BACKEND}
    assert sum(d.allowed for d in decisions) == 100


@pytest.mark.parametrize("own_connection", [True, False], ids=["own-connection", "redis-py"])
async def test_limiters_sharing_a_backend_each_decide_with_their_own_policies(
    redis_client: aioredis.Redis, own_connection: bool
) -> None:
    # The backend keeps what it packs per policy set: limiters that take turns on it
    # (the last one used is not theirs) each send their own policies.
    backend = RedisRateLimitBackend(redis_client, own_connection=own_connection)
    one = RateLimiter(FixedWindow(1, NO_ROLLOVER), TokenBucket(5, 5, 1.0), backend=backend)
    three = RateLimiter(FixedWindow(3, NO_ROLLOVER), backend=backend)
    also_three = RateLimiter(FixedWindow(3, NO_ROLLOVER), backend=backend)  # an equal set
    seen = []
    for _ in range(2):
        for limiter in (one, three, also_three):
            decision = await limiter.hit("shared")
            seen.append((decision.allowed, decision.limit, decision.remaining))
    # Equal policies share a quota (their state is named by their parameters).
    assert seen == [
        (True, 1, 0), (True, 3, 2), (True, 3, 1),
        (False, 1, 0), (True, 3, 0), (False, 3, 0),
    ]  # fmt: skip
    await backend.aclose()


def test_the_sync_backend_packs_per_policy_set_and_cost_on_the_servers_clock(
    sync_redis_client: redis.Redis,
) -> None:
    # Its arguments are packed once per (policy set, cost, peek): limiters taking turns
    # on one backend, costs and peeks mixed, each decide with what they asked.
    backend = SyncRedisRateLimitBackend(sync_redis_client)
    one = SyncRateLimiter(FixedWindow(1, NO_ROLLOVER), TokenBucket(5, 5, 1.0), backend=backend)
    five = SyncRateLimiter(FixedWindow(5, NO_ROLLOVER), backend=backend)
    seen = []
    for limiter, call, cost in [
        (five, "peek", 2), (five, "hit", 2), (one, "peek", 1), (five, "peek", 1),
        (one, "hit", 1), (five, "hit", 1), (one, "hit", 1), (five, "hit", 3),
        (five, "hit", 2),
    ]:  # fmt: skip
        decision = getattr(limiter, call)("shared", cost)
        seen.append((decision.allowed, decision.limit, decision.remaining))
    assert seen == [
        (True, 5, 5), (True, 5, 3), (True, 1, 1), (True, 5, 3),
        (True, 1, 0), (True, 5, 2), (False, 1, 0), (False, 5, 2),
        (True, 5, 0),
    ]  # fmt: skip
    backend.close()
