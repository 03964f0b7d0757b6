"""The Redis lock backends on a real 3-master Redis Cluster."""

from __future__ import annotations

import asyncio
from unittest.mock import ANY

import pytest
import redis
from redis.asyncio.cluster import RedisCluster

from headway import (
    Election,
    Leader,
    Lock,
    LockNotAcquired,
    RedisLockBackend,
    SyncLock,
    SyncRedisLockBackend,
)
from headway.lock import flow
from headway.lock.backends.redis.keys import lock_keys
from headway.lock.backends.redis.mode_keys import mode_keys
from headway.lock.shared import ReadWriteLock, Semaphore, SyncSemaphore
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
        # inspect's script reads the lock's keys in their one slot, wherever it is
        [holder] = (await Lock(backend, lease.resource).inspect()).holders
        assert holder.fence == lease.fence
        await backend.release(lease)
    await backend.aclose()
    await client.aclose()


async def test_cluster_election(cluster_port: int) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster_port)
    backend = RedisLockBackend(client)
    first = Election(backend, "cluster-leader", identity="node-1", ttl=5)
    second = Election(backend, "cluster-leader", identity="node-2", ttl=5)
    try:
        async with first.campaign() as term:
            with pytest.raises(LockNotAcquired):
                async with second.campaign(timeout=0):
                    pass
            assert await second.leader() == Leader("node-1", term.term, ANY)
        async with second.campaign(timeout=5) as later:
            assert later.term > term.term
            assert await first.leader() == Leader("node-2", later.term, ANY)
        assert await first.leader() is None
    finally:
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


async def test_cluster_read_write_locks_and_semaphores(cluster_port: int) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster_port)
    backend = RedisLockBackend(client)
    names = [f"doc/{i}" for i in range(12)]
    slots = {client.keyslot(mode_keys("rw", n).keys[0]) for n in names}
    assert len(slots) > 3  # spread over the nodes
    for name in names:
        rw = ReadWriteLock(backend, name, ttl=5, timeout=0)
        semaphore = Semaphore(backend, name, permits=2, ttl=5, timeout=0)
        readers = [await rw.read.acquire(), await rw.read.acquire()]
        with pytest.raises(LockNotAcquired):
            await rw.write.acquire()
        permits = [await semaphore.acquire(), await semaphore.acquire()]
        with pytest.raises(LockNotAcquired):
            await semaphore.acquire()
        assert {h.fence for h in (await rw.inspect()).holders} == {r.fence for r in readers}
        assert {h.fence for h in (await semaphore.inspect()).holders} == {p.fence for p in permits}
        for lease in readers:
            await rw.read.release(lease)
        for lease in permits:
            await semaphore.release(lease)
        await rw.write.release(await rw.write.acquire())
    await backend.aclose()
    await client.aclose()


async def test_cluster_read_write_contention_is_exact_and_woken(
    cluster_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster_port)
    backend = RedisLockBackend(client)
    rw = ReadWriteLock(backend, "hot-rw", ttl=5, timeout=30)
    inside = {"read": 0, "write": 0}
    overlaps: list[str] = []
    entered = 0

    async def worker(i: int) -> None:
        nonlocal entered
        for round_ in range(10):
            kind = "write" if (i + round_) % 3 == 0 else "read"
            lock = rw.write if kind == "write" else rw.read
            async with lock.hold():
                inside[kind] += 1
                entered += 1
                if inside["write"] > 1 or (inside["write"] and inside["read"]):
                    overlaps.append(str(inside))
                await asyncio.sleep(0.001)
                inside[kind] -= 1

    monkeypatch.setattr(flow, "WAIT_CAP", 60.0)  # woken on the sharded channel, or it times out
    async with asyncio.timeout(30):
        await asyncio.gather(*(worker(i) for i in range(6)))
    assert overlaps == []
    assert entered == 60
    await backend.aclose()
    await client.aclose()


def test_cluster_sync_semaphore(cluster_port: int) -> None:
    client = redis.RedisCluster(host="127.0.0.1", port=cluster_port)
    backend = SyncRedisLockBackend(client)
    semaphore = SyncSemaphore(backend, "sync-cluster-pool", permits=2, ttl=5)
    leases = [semaphore.acquire(timeout=0), semaphore.acquire(timeout=0)]
    with pytest.raises(LockNotAcquired):
        semaphore.acquire(timeout=0.2)
    for lease in leases:
        semaphore.release(lease)
    backend.close()
    client.close()
