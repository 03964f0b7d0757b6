"""The core suite on a real 3-master Redis Cluster (one hash tag per key: one slot)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from redis import asyncio as aioredis
from redis.cluster import RedisCluster

from headway import (
    Concurrency,
    ConcurrencyLimiter,
    FakeClock,
    RateLimiter,
    RedisRateLimitBackend,
    Source,
    SyncMemoryRateLimitBackend,
    SyncRedisRateLimitBackend,
)
from tests.ratelimit.strategies import EPOCH_US, set_us
from tests.ratelimit.test_concurrency import BUCKETS, WINDOWS
from tests.ratelimit.test_redis import POLICIES
from tests.redis_observed import commands_run, connections_named
from tests.servers import RedisServers, Server

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.slow]

NAME = "headway-cluster-test"  # the clients' connections, as CLIENT LIST names them


@pytest.fixture(scope="module")
def cluster(redis_servers: RedisServers) -> Iterator[list[Server]]:
    nodes = redis_servers.cluster(3)
    try:
        yield nodes
    finally:
        for node in nodes:
            redis_servers.stop(node)


@pytest.fixture
async def client(cluster: list[Server]) -> AsyncIterator[aioredis.RedisCluster]:
    c = aioredis.RedisCluster(
        host="127.0.0.1", port=cluster[0].port, max_connections=1024, client_name=NAME
    )
    await c.flushall()
    try:
        yield c
    finally:
        await c.aclose()


async def test_keys_spread_over_the_masters_and_limits_hold(
    client: aioredis.RedisCluster,
) -> None:
    limiter = RateLimiter(*POLICIES, backend=RedisRateLimitBackend(client))
    keys = [f"user-{i}" for i in range(30)]  # 30 hash tags land on every master
    for key in keys:
        assert (await limiter.hit(key, cost=10)).allowed
    for key in keys:
        assert not (await limiter.hit(key)).allowed
    await limiter.reset(keys[0])
    assert (await limiter.hit(keys[0])).allowed
    nodes = client.get_primaries()
    assert len({client.keyslot(k) * 0 + id(client.get_node_from_key(k)) for k in keys}) == len(
        nodes
    )
    # Every node's library gone: loaded again on the same call.
    await client.execute_command("FUNCTION FLUSH", target_nodes=RedisCluster.PRIMARIES)
    assert not (await limiter.hit(keys[1])).allowed


async def test_the_scripts_match_the_model_on_the_cluster(cluster: list[Server]) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    urls = [node.url for node in cluster]
    before = commands_run(*urls)
    try:
        clock = FakeClock()
        remote = SyncRedisRateLimitBackend(client, clock=clock)
        model = SyncMemoryRateLimitBackend(clock=clock)
        now = EPOCH_US
        for step in range(300):
            now += (step * 7919) % 400_000
            set_us(clock, now)
            key, cost, peek = f"k{step % 5}", 1 + step % 3, step % 7 == 0
            assert remote.decide(key, POLICIES, cost, peek) == model.decide(
                key, POLICIES, cost, peek
            )
        # One FCALL each on headway's sockets (a call sent again with its library failed
        # first, and is not counted); none through redis-py (EVALSHA).
        ran = commands_run(*urls) - before
        assert (ran["fcall"], ran["evalsha"]) == (300, 0)
    finally:
        client.close()


async def test_calls_go_over_headways_connections_one_per_primary(
    client: aioredis.RedisCluster, cluster: list[Server]
) -> None:
    backend = RedisRateLimitBackend(client)
    limiter = RateLimiter(*POLICIES, backend=backend)
    keys = [f"user-{i}" for i in range(30)]  # on every master
    urls = [node.url for node in cluster]
    try:
        # The first calls open headway's connections; once open, a call is written at
        # once, the limiter's fast path.
        await asyncio.gather(*(limiter.hit(key) for key in keys))
        before = commands_run(*urls)
        decisions = await asyncio.gather(*(limiter.hit(key) for key in keys))
        assert {d.source for d in decisions} == {Source.BACKEND}
        ran = commands_run(*urls) - before
        assert (ran["fcall"], ran["evalsha"]) == (30, 0)  # none through redis-py
        for url in urls:  # each primary's calls on one connection
            assert sum(c["cmd"] == "fcall" for c in connections_named(url, NAME)) == 1
    finally:
        await backend.aclose()


@pytest.mark.parametrize("policy", [*WINDOWS, *BUCKETS], ids=lambda p: p.name)
async def test_a_thousand_concurrent_hits_admit_exactly_the_limit(
    client: aioredis.RedisCluster, policy: object
) -> None:
    backend = RedisRateLimitBackend(client, clock=FakeClock(EPOCH_US / 1_000_000))
    verdicts = await asyncio.gather(
        *(backend.decide("hot", [policy], 1, False) for _ in range(1000))  # type: ignore[list-item]
    )
    assert sum(v.allowed for v in verdicts) == 100


async def test_concurrency_slots_are_counted_on_every_master(
    client: aioredis.RedisCluster,
) -> None:
    backend = RedisRateLimitBackend(client)
    limiter = ConcurrencyLimiter(Concurrency(5), backend=backend, budget=30)
    admissions = await asyncio.gather(*(limiter.acquire(f"user-{i % 30}") for i in range(600)))
    assert {a.source for a in admissions} == {Source.BACKEND}
    assert sum(a.allowed for a in admissions) == 30 * 5
    assert all(await asyncio.gather(*(limiter.release(a) for a in admissions if a.allowed)))
    assert await client.dbsize() == 0
