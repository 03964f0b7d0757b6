"""What only etcd shows: its keys, FIFO across clients, names, longer leases. Real etcd."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest

from headway import EtcdLockBackend, Lock, LockNotAcquired
from headway.lock.backends.etcd.codec import b64, unb64

pytestmark = pytest.mark.anyio


async def keys(etcd_url: str, namespace: str) -> list[str]:
    """Every key under ``namespace``, read with a client of our own."""
    end = namespace[:-1] + chr(ord(namespace[-1]) + 1)
    async with httpx.AsyncClient() as client:
        reply = await client.post(
            f"{etcd_url}/v3/kv/range",
            json={"key": b64(namespace), "range_end": b64(end), "keys_only": True},
        )
    return sorted(unb64(kv["key"]) for kv in reply.json().get("kvs", []))


async def until_waiting(lock: Lock, waiting: int) -> None:
    """Return once ``waiting`` requests wait in ``lock``'s line, as etcd tells
    (``inspect``): etcd's state, polled, not our own tasks."""
    async with asyncio.timeout(30):
        while (await lock.inspect()).waiting != waiting:
            await asyncio.sleep(0.005)


async def test_a_cancelled_waiter_leaves_no_key(
    etcd: EtcdLockBackend, etcd_url: str, namespace: str
) -> None:
    lock = Lock(etcd, "r", ttl=30, timeout=30)
    holder = await lock.acquire()
    waiter = asyncio.create_task(lock.acquire())
    await until_waiting(lock, 1)
    assert len(await keys(etcd_url, namespace)) == 2  # the holder's and the waiter's
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(await keys(etcd_url, namespace)) == 1
    await lock.release(holder)
    assert await keys(etcd_url, namespace) == []


async def test_names_are_escaped_and_never_share_a_prefix(
    etcd: EtcdLockBackend, etcd_url: str, namespace: str
) -> None:
    names = ["a", "a/b", "a/", "{x}:y", "é" * 10, "z" * 1000]
    leases = [await etcd.acquire(name, 5, 0) for name in names]  # each one is free
    found = await keys(etcd_url, namespace)
    assert len(found) == len(names)
    assert all(len(key) < 120 and "/a/b/" not in key for key in found)
    for lease in leases:
        await etcd.release(lease)


async def test_extend_past_the_lease_ttl_keeps_the_fence_and_the_place(
    etcd: EtcdLockBackend,
) -> None:
    lock = Lock(etcd, "r", ttl=2)
    lease = await lock.acquire()
    longer = await lock.extend(lease, ttl=30)  # a keep-alive cannot do this: a new lease
    assert longer.fence == lease.fence
    await asyncio.sleep(3.2)  # past the first lease (2 s, revoked within 0.5 s more)
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0)
    await lock.release(longer)
    await lock.release(await lock.acquire(timeout=0))


async def test_eight_clients_are_served_in_request_order(etcd_url: str, namespace: str) -> None:
    # Eight clients (a backend, so a connection pool, each) loop on one lock. Served
    # first come, first served, with every other client queued while one holds, the
    # grants go round: the ninth grant goes to the first client again, and so on.
    backends = [EtcdLockBackend(etcd_url, namespace=namespace) for _ in range(8)]
    grants: list[int] = []
    fences: list[int] = []
    rounds = 6

    async def worker(i: int) -> None:
        lock = Lock(backends[i], "fifo", ttl=20, timeout=60)
        for _ in range(rounds):
            lease = await lock.acquire()
            grants.append(i)
            fences.append(lease.fence)
            await lock.release(lease)

    first = await Lock(backends[0], "fifo", ttl=20).acquire()
    line = Lock(backends[0], "fifo")
    tasks = []
    for i in range(len(backends)):
        tasks.append(asyncio.create_task(worker(i)))
        await until_waiting(line, i + 1)  # the next client asks only once this one is in line
    await backends[0].release(first)
    async with asyncio.timeout(120):
        await asyncio.gather(*tasks)
    for backend in backends:
        await backend.aclose()
    assert grants == list(range(8)) * rounds
    assert all(a < b for a, b in itertools.pairwise(fences))
