"""``MultiLock`` on Redis in one script (``acquire_many``, ``release_many``): all or
nothing, each lock's own fence, waiters not cut in on, one round trip per acquire and
per release when free, Redis Cluster with ``{tag}`` names."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis import asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from headway import Lock, LockNotAcquired, MultiLock, RedisLockBackend
from headway.lock.backends.redis.keys import lock_keys, one_slot
from tests.lock.backends.redis.test_redis_lock import TOP_LEVEL
from tests.servers import RedisServers

pytestmark = pytest.mark.anyio


def _names(n: int = 3, tag: str = "") -> list[str]:
    run = uuid.uuid4().hex[:8]
    return [f"{tag}{run}-{chr(ord('a') + i)}" for i in range(n)]


async def _fcalls(client: aioredis.Redis) -> dict[str, int]:
    calls = {k: v["calls"] for k, v in (await client.info("commandstats")).items()}
    return {k: n for k, n in calls.items() if k in TOP_LEVEL}


async def test_a_free_set_is_one_round_trip_each_way(redis_servers: RedisServers) -> None:
    server = redis_servers.start()
    client = aioredis.Redis(port=server.port)
    backend = RedisLockBackend(client)
    lock = MultiLock(backend, _names(3), ttl=5)
    await lock.release(await lock.acquire(timeout=0))  # library loaded, connection open
    await client.config_resetstat()
    for _ in range(50):
        await lock.release(await lock.acquire())
    async with lock.hold():
        pass
    # One FCALL per acquire and one per release, for three names.
    assert await _fcalls(client) == {"cmdstat_config|resetstat": 1, "cmdstat_fcall": 102}
    await backend.aclose()
    await client.aclose()
    redis_servers.stop(server)


async def test_one_busy_name_takes_nothing(redis_client: aioredis.Redis) -> None:
    names = _names(3)
    # Another client holds the middle name (one of ours would make the set ride instead).
    other = RedisLockBackend(redis_client)
    held = await other.acquire(names[1], 10, 0)
    backend = RedisLockBackend(redis_client)
    with pytest.raises(LockNotAcquired) as caught:
        await MultiLock(backend, names, ttl=10).acquire(timeout=0)
    assert caught.value.resource == names[1]
    assert await redis_client.exists(lock_keys(names[0]).owner, lock_keys(names[2]).owner) == 0
    await other.release(held)
    leases = await MultiLock(backend, names, ttl=10).acquire(timeout=0)
    assert [lease.resource for lease in leases] == sorted(names)
    await MultiLock(backend, names).release(leases)
    await backend.aclose()
    await other.aclose()


async def test_each_lock_gets_its_own_rising_fence(redis_client: aioredis.Redis) -> None:
    names = _names(3)
    backend = RedisLockBackend(redis_client)
    lock = MultiLock(backend, names, ttl=10)
    last = [0, 0, 0]
    for round_ in range(5):
        leases = await lock.acquire(timeout=0)
        for i, lease in enumerate(leases):
            assert lease.fence > last[i]
            # Each fence is its own lock's counter, as a single Lock would raise it.
            counter = await redis_client.get(lock_keys(lease.resource).fence)
            assert counter is not None
            assert int(counter) == lease.fence
            last[i] = lease.fence
        await lock.release(leases)
        if round_ == 2:  # a single Lock between rounds raises the same counter
            single = await Lock(backend, names[0]).acquire(timeout=0)
            assert single.fence > last[0]
            last[0] = single.fence
            await backend.release(single)
    await backend.aclose()


async def test_a_free_name_with_a_waiter_goes_to_the_waiter(redis_client: aioredis.Redis) -> None:
    names = _names(3)
    keys = lock_keys(names[2])
    # The holder of names[2] died: its lease ran out, and a waiter is still in line.
    waiter = f"{uuid.uuid4().hex}:5000:"
    server_ms = int((await redis_client.time())[0]) * 1000
    await redis_client.zadd(keys.queue, {waiter: 1})
    await redis_client.zadd(keys.places, {waiter: server_ms + 60_000})
    backend = RedisLockBackend(redis_client)
    with pytest.raises(LockNotAcquired) as caught:
        await MultiLock(backend, names, ttl=10).acquire(timeout=0)
    assert caught.value.resource == names[2]
    # The waiter was handed the lock (as a single acquire would do); nothing else taken.
    assert await redis_client.get(keys.owner) == waiter.split(":")[0].encode()
    assert await redis_client.exists(lock_keys(names[0]).owner, lock_keys(names[1]).owner) == 0
    await redis_client.delete(keys.owner)
    await backend.aclose()


async def test_a_cancelled_acquire_leaves_every_name_free(redis_client: aioredis.Redis) -> None:
    backend = RedisLockBackend(redis_client)
    probe = RedisLockBackend(redis_client)
    for turns in range(6):
        names = _names(3)
        task = asyncio.create_task(MultiLock(backend, names, ttl=30).acquire(timeout=0))
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        try:
            leases = await task
        except asyncio.CancelledError:
            leases = None
        if leases is not None:
            await MultiLock(backend, names).release(leases)
        for name in names:
            # Another client gets each well before its 30 s lease would run out: a grant
            # that lands after the cancellation is given back as its reply arrives.
            await probe.release(await probe.acquire(name, 5, 2))
    await backend.aclose()
    await probe.aclose()


async def test_crossed_orders_of_two_clients_exclude(redis_client: aioredis.Redis) -> None:
    # Two backends (as two processes): each takes {a, b} in one script when free, and
    # waits in the queues, one by one, when the other holds it.
    names, rounds = _names(2), 250
    inside = overlaps = 0
    done = {"ab": 0, "ba": 0}

    async def caller(order: str, backend: RedisLockBackend) -> None:
        nonlocal inside, overlaps
        pair = names if order == "ab" else names[::-1]
        lock = MultiLock(backend, pair, ttl=10, timeout=30)
        for _ in range(rounds):
            async with lock.hold():
                inside += 1
                overlaps += inside > 1
                await asyncio.sleep(0)
                inside -= 1
                done[order] += 1

    first, second = RedisLockBackend(redis_client), RedisLockBackend(redis_client)
    async with asyncio.timeout(120), asyncio.TaskGroup() as tg:
        tg.create_task(caller("ab", first))
        tg.create_task(caller("ba", second))
    assert overlaps == 0
    assert done == {"ab": rounds, "ba": rounds}
    await first.aclose()
    await second.aclose()


@pytest.fixture(scope="module")
def cluster_port(redis_servers: RedisServers) -> int:
    return redis_servers.cluster(3)[0].port


async def test_cluster_names_sharing_a_tag_take_one_script(cluster_port: int) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster_port)
    backend = RedisLockBackend(client)
    tagged = _names(3, tag="{order:42}:")
    assert one_slot(tagged, sharded=True)
    lock, single = MultiLock(backend, tagged, ttl=10), Lock(RedisLockBackend(client), tagged[1])
    await lock.release(await lock.acquire(timeout=0))  # warm: libraries, connections
    await single.release(await single.acquire(timeout=0))
    nodes = client.get_primaries()
    await client.config_resetstat(target_nodes=nodes)
    leases = await lock.acquire(timeout=0)
    with pytest.raises(LockNotAcquired):
        await single.acquire(timeout=0)
    await lock.release(leases)
    stats = await client.info("commandstats", target_nodes=nodes)
    fcalls = sum(s.get("cmdstat_fcall", {}).get("calls", 0) for s in stats.values())
    assert fcalls == 3  # the set's acquire and release, and the single refused attempt
    # Names in different slots: taken one by one, all the same.
    spread = _names(3)
    assert not one_slot(spread, sharded=True)
    spread_lock = MultiLock(backend, spread, ttl=10)
    await spread_lock.release(await spread_lock.acquire(timeout=0))
    await backend.aclose()
    await client.aclose()
