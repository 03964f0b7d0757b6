"""The Redis lock backends on a real 3-master Redis Cluster."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.asyncio.cluster import RedisCluster

from headway import Lock, LockNotAcquired, RedisLockBackend, SyncLock, SyncRedisLockBackend
from headway.lock.backends.redis.keys import lock_keys
from tests.servers import RedisServers

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def cluster_port(redis_servers: RedisServers) -> int:
    return redis_servers.cluster(3)[0].port


async def test_cluster_locks_across_slots(cluster_port: int) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster_port)
    backend = RedisLockBackend(client)
    names = [f"order/{i}" for i in range(30)] + ["{x}:y", ""]
    leases = [await Lock(backend, n, ttl=5).acquire(timeout=0) for n in names]
    slots = {client.keyslot(lock_keys(n).owner) for n in names}
    assert len(slots) > 3  # spread over the nodes
    for lease in leases:
        with pytest.raises(LockNotAcquired):
            await Lock(backend, lease.resource).acquire(timeout=0)
        await backend.release(lease)
    await backend.aclose()
    await client.aclose()


async def test_cluster_contention_is_exact_and_woken(cluster_port: int) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster_port)
    backend = RedisLockBackend(client)
    lock = Lock(backend, "hot", ttl=5, timeout=30)
    counter = 0
    fences: list[int] = []

    async def worker() -> None:
        nonlocal counter
        for _ in range(20):
            lease = await lock.acquire()
            value = counter
            await asyncio.sleep(0)
            counter = value + 1
            fences.append(lease.fence)
            await lock.release(lease)

    async with asyncio.timeout(30):
        await asyncio.gather(*(worker() for _ in range(6)))
    assert counter == 120
    assert fences == sorted(fences)
    await backend.aclose()
    await client.aclose()


def test_cluster_sync_client(cluster_port: int) -> None:
    client = redis.RedisCluster(host="127.0.0.1", port=cluster_port)
    backend = SyncRedisLockBackend(client)
    lock = SyncLock(backend, "sync-cluster", ttl=5)
    lease = lock.acquire(timeout=0)
    with pytest.raises(LockNotAcquired):
        lock.acquire(timeout=0.2)
    lock.release(lease)
    backend.close()
    client.close()
