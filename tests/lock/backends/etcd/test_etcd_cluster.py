"""etcd as a real 3-member cluster on loopback: a killed leader, a lost quorum."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

import pytest

from headway import BackendUnavailable, EtcdLockBackend, Lock, LockNotOwned
from tests.etcd_servers import EtcdCluster

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TIMEOUT = 1.0  # the backend's bound on every call


async def test_locking_goes_on_when_the_leader_is_killed(etcd_cluster: EtcdCluster) -> None:
    leader = etcd_cluster.leader()
    assert leader is not None
    # The leader first: every call goes to it until it dies, then to the others.
    urls = [leader.url, *(url for url in etcd_cluster.urls if url != leader.url)]
    backend = EtcdLockBackend(urls, timeout=3.0, namespace="kill/")
    lock = Lock(backend, "r", ttl=5, timeout=20)
    fences: list[int] = []
    inside = most = 0
    warm, after = asyncio.Event(), asyncio.Event()
    killed_at: list[int] = []
    stop = False

    async def worker() -> None:
        nonlocal inside, most
        while not stop:
            try:
                lease = await lock.acquire()
            except BackendUnavailable:
                continue  # the election outlasted a call: ask again
            inside += 1
            most = max(most, inside)
            fences.append(lease.fence)
            await asyncio.sleep(0)  # let a rival run while we hold
            inside -= 1
            if len(fences) >= 20:
                warm.set()
            if killed_at and len(fences) >= killed_at[0] + 20:
                after.set()
            # A release lost in the election: the lease runs out, someone else goes on.
            with contextlib.suppress(BackendUnavailable, LockNotOwned):
                await lock.release(lease)

    tasks = [asyncio.create_task(worker()) for _ in range(4)]
    try:
        async with asyncio.timeout(30):
            await warm.wait()
            etcd_cluster.stop(leader)
            killed_at.append(len(fences))
            await after.wait()
    finally:
        stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await backend.aclose()
    assert most == 1
    assert all(a < b for a, b in itertools.pairwise(fences))
    assert len(fences) >= killed_at[0] + 20
    assert etcd_cluster.leader() not in (None, leader)


async def test_without_quorum_acquires_fail_in_time_and_resume_after(
    etcd_cluster: EtcdCluster,
) -> None:
    backend = EtcdLockBackend(etcd_cluster.urls, timeout=TIMEOUT, namespace="quorum/")
    lock = Lock(backend, "r", ttl=5, timeout=0)
    try:
        before = await lock.acquire()
        await lock.release(before)
        for member in etcd_cluster.members[:2]:
            etcd_cluster.stop(member)
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match="etcd did not answer within 1 s"):
                await lock.acquire()
            assert time.monotonic() - started < TIMEOUT + 0.5
        for member in etcd_cluster.members[:2]:
            etcd_cluster.start(member)
        await asyncio.to_thread(etcd_cluster.wait_for_leader, 30)
        deadline = time.monotonic() + 20
        while True:
            try:
                # An attempt whose reply the outage lost may have left its key: the
                # backend deletes it in the background, and this acquire waits for that.
                after = await lock.acquire(timeout=10)
                break
            except BackendUnavailable:
                assert time.monotonic() < deadline, "no acquire within 20 s of the restart"
        assert after.fence > before.fence
        await lock.release(after)
    finally:
        await backend.aclose()
