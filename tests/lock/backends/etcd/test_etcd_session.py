"""The session lease: one per TTL, kept alive in the background; its loss loses its locks;
``aclose`` revokes what holds nothing; waiting costs no calls. Real etcd, both transports."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from headway import EtcdLockBackend, Lock, LockLost, LockNotOwned
from headway.lock.backends.etcd.codec import b64

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["grpc", "gateway"])
async def backend(
    request: pytest.FixtureRequest, etcd_url: str, namespace: str
) -> AsyncIterator[EtcdLockBackend]:
    backend = EtcdLockBackend(etcd_url, namespace=namespace, transport=request.param)
    try:
        yield backend
    finally:
        await backend.aclose()


async def etcd(etcd_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One call through the gateway with a client of our own."""
    async with httpx.AsyncClient() as client:
        reply = await client.post(f"{etcd_url}/v3/{path}", json=body)
    result: dict[str, Any] = reply.json()
    return result


async def leases(etcd_url: str, namespace: str) -> list[int]:
    """The lease of each key under ``namespace``, in create order."""
    end = namespace[:-1] + chr(ord(namespace[-1]) + 1)
    body = {"key": b64(namespace), "range_end": b64(end), "sort_target": "CREATE"}
    reply = await etcd(etcd_url, "kv/range", body)
    return [int(kv.get("lease", 0)) for kv in reply.get("kvs", [])]


async def lease_ttl(etcd_url: str, lease: int) -> int:
    """The lease's remaining TTL on the server (-1: it is gone)."""
    return int((await etcd(etcd_url, "lease/timetolive", {"ID": str(lease)}))["TTL"])


async def test_locks_of_one_ttl_share_one_session(
    backend: EtcdLockBackend, etcd_url: str, namespace: str
) -> None:
    a, b = await backend.acquire("a", 5, 0), await backend.acquire("b", 5, 0)
    c = await backend.acquire("c", 7, 0)
    first, second, third = await leases(etcd_url, namespace)
    assert first == second != third
    assert 5 < await lease_ttl(etcd_url, third) <= 7  # each session has its TTL
    for lease in (a, b, c):
        await backend.release(lease)
    assert await leases(etcd_url, namespace) == []


async def test_a_lost_session_loses_its_locks_and_a_new_one_follows(
    backend: EtcdLockBackend, etcd_url: str, namespace: str
) -> None:
    lock = Lock(backend, "r", ttl=3)
    lease = await lock.acquire()
    (session,) = await leases(etcd_url, namespace)
    await etcd(etcd_url, "lease/revoke", {"ID": str(session)})  # as an expiry would
    with pytest.raises(LockNotOwned):
        await lock.extend(lease)  # its keep-alive is refused
    with pytest.raises(LockNotOwned):
        await lock.release(lease)
    again = await lock.acquire(timeout=0)  # under a new session
    assert again.fence > lease.fence
    assert await leases(etcd_url, namespace) not in ([], [session])
    await lock.release(again)


async def test_hold_cancels_the_block_when_its_session_is_lost(
    backend: EtcdLockBackend, etcd_url: str, namespace: str
) -> None:
    lock = Lock(backend, "r", ttl=2)
    started = time.monotonic()
    with pytest.raises(LockLost):
        async with lock.hold():
            (session,) = await leases(etcd_url, namespace)
            await etcd(etcd_url, "lease/revoke", {"ID": str(session)})
            await asyncio.sleep(10)  # cancelled at the next renewal (within the ttl)
    assert time.monotonic() - started < 2.5


async def test_aclose_revokes_idle_sessions_and_leaves_held_locks_to_lapse(
    etcd_url: str, namespace: str
) -> None:
    first = EtcdLockBackend(etcd_url, namespace=namespace)
    held = await first.acquire("held", 2, 0)
    idle = await first.acquire("idle", 3, 0)
    kept, revoked = await leases(etcd_url, namespace)
    await first.release(idle)
    await first.aclose()
    assert await lease_ttl(etcd_url, revoked) == -1  # held nothing: revoked
    assert await lease_ttl(etcd_url, kept) > 0  # still holds: left to run out
    assert await leases(etcd_url, namespace) == [kept]
    second = EtcdLockBackend(etcd_url, namespace=namespace)
    try:
        lease = await second.acquire("held", 2, 5)  # once the kept session ran out
        assert lease.fence > held.fence
        await second.release(lease)
    finally:
        await second.aclose()


async def test_waiting_costs_no_calls(
    backend: EtcdLockBackend, etcd_url: str, namespace: str
) -> None:
    lock = Lock(backend, "r", ttl=30, timeout=30)
    holder = await lock.acquire()
    calls: Counter[str] = Counter()
    transport: Any = backend._gateway
    original = transport.call

    async def counted(path: str, body: dict[str, Any]) -> Any:
        calls[path] += 1
        return await original(path, body)

    transport.call = counted
    waiter = asyncio.create_task(lock.acquire())
    while len(await leases(etcd_url, namespace)) < 2:
        await asyncio.sleep(0.01)
    before = calls.copy()
    await asyncio.sleep(1.6)  # three of the driver's capped waits (WAIT_CAP: 0.5 s)
    # No attempt (txn), no keep-alive (the 30 s session's are 10 s apart); at most the
    # one look of the watch as it opens, if the shared server's revision moved meanwhile.
    assert calls - before <= Counter({"kv/range": 1}), calls - before
    await lock.release(holder)
    await lock.release(await waiter)
