"""What only the async Redis backend can show: keys, round trips, scripts, outages."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
from redis import asyncio as aioredis

from headway import BackendUnavailable, Lock, LockNotAcquired, LockNotOwned, RedisLockBackend
from headway.lock.backends.redis.keys import RELEASE, lock_keys, release_call
from tests.redis_observed import commands_run
from tests.servers import RedisServers, free_port

pytestmark = pytest.mark.anyio

# Commands a client might send on its own (scripts run GET, SET, ZRANGE... inside).
TOP_LEVEL = {
    "cmdstat_config|resetstat", "cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval",
    "cmdstat_function|load", "cmdstat_ping",
    "cmdstat_subscribe", "cmdstat_unsubscribe", "cmdstat_client|setinfo", "cmdstat_hello",
    "cmdstat_select", "cmdstat_script|load", "cmdstat_info",
}  # fmt: skip


async def test_every_key_has_a_ttl(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    lock = Lock(redis_backend, "ttl-check", ttl=30)
    holder = await lock.acquire()
    # Another client's waiter queues in Redis at once (one of ours would ride on the
    # holder's release instead).
    other = Lock(RedisLockBackend(redis_client), "ttl-check", ttl=30)
    waiter = asyncio.create_task(other.acquire(timeout=5))
    keys = lock_keys("ttl-check")
    async with asyncio.timeout(5):
        while not await redis_client.exists(keys.queue):
            await asyncio.sleep(0.01)
    found = [key async for key in redis_client.scan_iter("headway:*")]
    assert {k.decode() for k in found} == {keys.owner, keys.fence, keys.queue, keys.places}
    for key in found:
        assert await redis_client.pttl(key) > 0, key
    await lock.release(holder)
    await other.release(await waiter)


async def test_uncontended_cycle_is_two_round_trips(redis_servers: RedisServers) -> None:
    server = redis_servers.start()
    client = aioredis.Redis(port=server.port)
    lock = Lock(RedisLockBackend(client), "rt", ttl=5)
    await lock.release(await lock.acquire())  # scripts cached, connection open
    await client.config_resetstat()
    for _ in range(100):
        await lock.release(await lock.acquire())
    calls = {k: v["calls"] for k, v in (await client.info("commandstats")).items()}
    # Commands run inside scripts are counted too; the client sent only FCALLs.
    top_level = {k: n for k, n in calls.items() if k in TOP_LEVEL}
    assert top_level == {"cmdstat_config|resetstat": 1, "cmdstat_fcall": 200}
    await client.aclose()
    redis_servers.stop(server)


async def test_concurrent_locks_share_pipelined_round_trips(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis, redis_url: str
) -> None:
    locks = [Lock(redis_backend, f"order/{i}", ttl=5) for i in range(200)]
    before = commands_run(redis_url)
    leases = await asyncio.gather(*(lock.acquire(timeout=0) for lock in locks))
    ran = commands_run(redis_url) - before
    assert (ran["fcall"], ran["evalsha"]) == (200, 0)  # one call each, on headway's connection
    # The wire's private count, the only one: the server's reads split and merge writes.
    assert redis_backend._wires.wire().writes <= 20  # coalesced, not one write each
    for lease in leases:  # every grant is real, and each lock has its own
        assert await redis_client.get(lock_keys(lease.resource).owner) == lease.token.encode()
    await asyncio.gather(*(lock.release(lease) for lock, lease in zip(locks, leases, strict=True)))
    assert not [k async for k in redis_client.scan_iter("headway:{lock:*}:owner")]
    # Contended locks still exclude: each is held, so a second round grants nothing.
    again = await asyncio.gather(*(lock.acquire(timeout=0) for lock in locks))
    refused = await asyncio.gather(
        *(lock.acquire(timeout=0) for lock in locks), return_exceptions=True
    )
    assert all(isinstance(r, LockNotAcquired) for r in refused)
    await asyncio.gather(*(lock.release(lease) for lock, lease in zip(locks, again, strict=True)))


@pytest.mark.parametrize("name", ["", "{a}:b", "x" * 1_000_000, "\u2603\x00", "headway:{lock:r}"])
async def test_hostile_names_work_and_stay_in_bounded_keys(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis, name: str
) -> None:
    lock = Lock(redis_backend, name, ttl=5)
    lease = await lock.acquire(timeout=0)
    assert lease.resource == name
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0)
    async for key in redis_client.scan_iter("*"):
        assert len(key) < 100
    await lock.release(lease)


async def test_a_flushed_library_is_loaded_again(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    lock = Lock(redis_backend, "r", ttl=5)
    lease = await lock.acquire()
    await redis_client.function_flush()
    lease = await lock.extend(lease)
    await redis_client.function_flush()
    await lock.release(lease)
    await redis_client.function_flush()
    await lock.release(await lock.acquire())


async def test_a_retried_release_is_not_reported_as_lost(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    # redis-py retries a command whose reply was lost: the release script runs twice,
    # the second time possibly after another holder took the lock.
    lock = Lock(redis_backend, "r", ttl=5)
    lease = await lock.acquire()
    keys, args = release_call("r", lease.token)
    assert await RELEASE.run(redis_client, keys, args) == 1
    successor = await lock.acquire(timeout=0)
    assert await RELEASE.run(redis_client, keys, args) == 1  # the retry: still "released"
    with pytest.raises(LockNotAcquired):  # ... and the successor was not touched
        await lock.acquire(timeout=0)
    with pytest.raises(LockNotOwned):  # a second release *call* is still refused
        await lock.release(lease)
    await lock.release(successor)
    # A lease that lapsed without being released is still reported.
    stale = await lock.acquire(ttl=0.05)
    await asyncio.sleep(0.15)
    with pytest.raises(LockNotOwned):
        await lock.release(stale)


async def test_fence_survives_lost_counter(
    redis_backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    lock = Lock(redis_backend, "r", ttl=5)
    first = await lock.acquire()
    await lock.release(first)
    await redis_client.flushdb()  # a restart without persistence loses the counter
    second = await lock.acquire()
    assert second.fence > first.fence
    await lock.release(second)


async def test_redis_down_raises_backend_unavailable_within_timeout() -> None:
    backend = RedisLockBackend.from_url(f"redis://127.0.0.1:{free_port()}", timeout=0.5)
    lock = Lock(backend, "r")
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as caught:
        await lock.acquire(timeout=0)
    assert caught.value.backend == "redis"
    assert time.monotonic() - started < 0.5 + 1.0
    await backend.client.aclose()


async def test_redis_stalled_raises_backend_unavailable_within_timeout(
    redis_servers: RedisServers,
) -> None:
    server = redis_servers.start()
    backend = RedisLockBackend.from_url(server.url, timeout=0.3)
    lock = Lock(backend, "r")
    await lock.release(await lock.acquire())
    pause = redis.Redis(port=server.port)
    pause.client_pause(2000)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable):
        await lock.acquire(timeout=0)
    assert time.monotonic() - started < 0.3 + 1.0
    pause.client_unpause()
    pause.close()
    await backend.client.aclose()
    redis_servers.stop(server)
