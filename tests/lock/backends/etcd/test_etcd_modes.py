"""What only etcd shows of read-write locks and semaphores: their keys, what each waiter
watches, and leases that end on the server. Real etcd."""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import httpx
import pytest

from headway import EtcdLockBackend, Lock, LockNotAcquired, LockNotOwned
from headway.lock import flow
from headway.lock.backends.etcd.codec import b64, unb64
from headway.lock.shared import ReadWriteLock, Semaphore
from tests.lock.test_modes import queued

pytestmark = pytest.mark.anyio


async def entries(etcd_url: str, namespace: str) -> dict[str, str]:
    """Every key under ``namespace`` with its value, read with a client of our own."""
    end = namespace[:-1] + chr(ord(namespace[-1]) + 1)
    async with httpx.AsyncClient() as client:
        reply = await client.post(
            f"{etcd_url}/v3/kv/range", json={"key": b64(namespace), "range_end": b64(end)}
        )
    kvs = reply.json().get("kvs", [])
    return {unb64(kv["key"])[len(namespace) :]: unb64(kv.get("value", "")) for kv in kvs}


@pytest.fixture
def woken_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiter that no watch wakes waits past the test's bound instead of retrying."""
    monkeypatch.setattr(flow, "WAIT_CAP", 60.0)


async def test_each_family_keeps_its_keys_apart_from_the_exclusive_lock(
    etcd: EtcdLockBackend, etcd_url: str, namespace: str
) -> None:
    rw = ReadWriteLock(etcd, "doc", ttl=10, timeout=0)
    semaphore = Semaphore(etcd, "doc", permits=3, ttl=10, timeout=0)
    lock = Lock(etcd, "doc", ttl=10, timeout=0)
    leases = [await rw.read.acquire(), await semaphore.acquire(), await lock.acquire()]
    found = await entries(etcd_url, namespace)
    assert {re.sub("[0-9a-f]{16}$", "<lease>", key): value for key, value in found.items()} == {
        "rw/doc/r/<lease>": "",  # a reader
        "permits/doc/p/<lease>": "3",  # a permit holds the permits its acquire asked for
        "lock/doc/<lease>": "",  # the exclusive lock, apart from both
    }
    await rw.read.release(leases[0])
    await semaphore.release(leases[1])
    await lock.release(leases[2])
    assert await entries(etcd_url, namespace) == {}


@pytest.mark.parametrize("mode", ["read", "write", "permits"])
@pytest.mark.parametrize("how", ["cancelled", "timed out"])
async def test_a_waiter_that_gives_up_leaves_no_key(
    etcd: EtcdLockBackend, etcd_url: str, namespace: str, mode: str, how: str
) -> None:
    rw = ReadWriteLock(etcd, "doc", ttl=30, timeout=30)
    semaphore = Semaphore(etcd, "doc", permits=1, ttl=30, timeout=30)
    lock = {"read": rw.read, "write": rw.write, "permits": semaphore}[mode]
    blocker = semaphore if mode == "permits" else rw.write
    held = await blocker.acquire()
    if how == "cancelled":
        waiter = await queued(lock, lock.acquire)
        assert len(await entries(etcd_url, namespace)) == 2  # the holder's and the waiter's
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
    else:
        with pytest.raises(LockNotAcquired):
            await lock.acquire(timeout=0.3)
    assert len(await entries(etcd_url, namespace)) == 1
    await blocker.release(held)
    assert await entries(etcd_url, namespace) == {}


async def in_queue(etcd_url: str, prefix: str) -> list[str]:
    """The keys under ``prefix``, oldest first (the queue's order)."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    async with httpx.AsyncClient() as client:
        reply = await client.post(
            f"{etcd_url}/v3/kv/range",
            json={
                "key": b64(prefix),
                "range_end": b64(end),
                "sort_target": "CREATE",
                "sort_order": "ASCEND",
                "keys_only": True,
            },
        )
    return [unb64(kv["key"]) for kv in reply.json().get("kvs", [])]


@pytest.mark.usefixtures("woken_only")
async def test_each_waiter_watches_only_what_it_waits_for(
    etcd: EtcdLockBackend, etcd_url: str, namespace: str
) -> None:
    rw = ReadWriteLock(etcd, "doc", ttl=30, timeout=30)
    semaphore = Semaphore(etcd, "pool", permits=1, ttl=30, timeout=30)
    watched: list[tuple[str, str | None]] = []
    gateway: Any = etcd._gateway
    original = gateway.deleted

    async def deleted(key: str, seen: int, seconds: float, **options: Any) -> None:
        watched.append((key, options.get("range_end")))
        await original(key, seen, seconds, **options)

    gateway.deleted = deleted
    reader = await rw.read.acquire()
    waiters = [
        await queued(rw.write, rw.write.acquire),
        await queued(rw.read, rw.read.acquire),
        await queued(rw.read, rw.read.acquire),
        await queued(rw.write, rw.write.acquire),
    ]
    permit = await semaphore.acquire()
    permit_waiter = await queued(semaphore, semaphore.acquire)
    first, writer, _, third, _ = await in_queue(etcd_url, f"{namespace}rw/")
    (pool,) = {
        key.rsplit("/", 2)[0] + "/" for key in await in_queue(etcd_url, f"{namespace}permits/")
    }
    assert (
        sorted(watched)
        == sorted(
            [
                (first, None),  # the writer: the key just before it
                (writer, None),  # the second reader: the last writer before it
                (writer, None),  # the third reader too (not the reader just before it)
                (third, None),  # the last writer: the key just before it
                (pool, pool[:-1] + "0"),  # the permit: every key of its family
            ]
        )
    )
    await rw.read.release(reader)
    lease = await waiters[0]
    assert not any(task.done() for task in waiters[1:])
    await rw.write.release(lease)
    async with asyncio.timeout(10):
        readers = await asyncio.gather(*waiters[1:3])
    assert not waiters[3].done()
    for lease in readers:
        await rw.read.release(lease)
    await rw.write.release(await waiters[3])
    await semaphore.release(permit)
    await semaphore.release(await permit_waiter)


@pytest.mark.usefixtures("woken_only")
async def test_a_crashed_holders_lease_ends_on_the_server(etcd: EtcdLockBackend) -> None:
    # etcd's shortest lease is 2 s: a holder that never releases is gone within it (and
    # its expiry, a delete, wakes the waiter: with WAIT_CAP patched up, nothing else does).
    rw = ReadWriteLock(etcd, "doc", ttl=2, timeout=10)
    semaphore = Semaphore(etcd, "pool", permits=1, ttl=2, timeout=10)
    crashed_writer, crashed_permit = await rw.write.acquire(), await semaphore.acquire()
    async with asyncio.timeout(8):
        # The waiters' own leases outlast the wait (nothing renews them while it lasts).
        reader, permit = await asyncio.gather(rw.read.acquire(ttl=10), semaphore.acquire(ttl=10))
    assert reader.fence > crashed_writer.fence
    assert permit.fence > crashed_permit.fence
    with pytest.raises(LockNotOwned):
        await semaphore.extend(crashed_permit)
    with pytest.raises(LockNotOwned):
        await rw.write.release(crashed_writer)
    await semaphore.release(permit)
    await rw.read.release(reader)


@pytest.mark.usefixtures("woken_only")
async def test_a_raised_capacity_lets_in_the_waiters_ahead(
    etcd: EtcdLockBackend, etcd_url: str, namespace: str
) -> None:
    one = Semaphore(etcd, "pool", permits=1, ttl=30, timeout=30)
    held = await one.acquire()
    waiter = await queued(one, one.acquire)
    # Three permits now: the waiter fits (one holder ahead of it), and so does the
    # newcomer behind it; no release wakes the waiter, the raise does.
    newcomer = await Semaphore(etcd, "pool", permits=3, ttl=30, timeout=0).acquire()
    async with asyncio.timeout(10):
        woken = await waiter
    assert held.fence < woken.fence < newcomer.fence
    for lease in (held, woken, newcomer):
        await one.release(lease)
    assert await entries(etcd_url, namespace) == {}
