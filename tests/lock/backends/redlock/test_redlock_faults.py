"""Redlock under rivals and faults: clients in threads, nodes killed mid-test,
cancellation, renewal while the majority dies."""

from __future__ import annotations

import asyncio
import contextlib

import anyio
import pytest
from redis import asyncio as aioredis

from headway import Lease, Lock
from headway._errors import LockLost
from headway.lock.backends.redis.keys import lock_keys
from headway.lock.backends.redlock import RedlockBackend
from tests.lock.backends.redlock.nodes import (
    LOOP_TEARDOWN,
    N,
    Nodes,
    count_exclusively,
    increasing,
    owners,
)

pytestmark = pytest.mark.anyio


@LOOP_TEARDOWN
@pytest.mark.parametrize("fencing", [True, False])
def test_mutual_exclusion_counted_exactly(nodes: Nodes, fencing: bool) -> None:
    count, fences = count_exclusively(nodes.urls, threads=4, tasks=2, rounds=25, fencing=fencing)
    assert count == 200
    assert len(fences) == 200
    if fencing:
        assert increasing(fences)
    else:
        assert set(fences) == {0}


@LOOP_TEARDOWN
def test_two_of_five_down_still_grants_and_excludes(nodes: Nodes) -> None:
    nodes.kill(0, 3)
    count, fences = count_exclusively(nodes.urls, threads=2, tasks=2, rounds=10)
    assert count == 40
    assert increasing(fences)


async def test_fence_increases_across_node_failures(
    nodes: Nodes, backend: RedlockBackend, direct: list[aioredis.Redis], resource: str
) -> None:
    """Nodes die and return empty; as long as a majority of all nodes keep the counter the
    last lease wrote back, the next fence is higher, even when the dead node's counter was
    far ahead of the others (so the server-time floor cannot be what saves it)."""
    fence_key = lock_keys(resource).fence
    fences: list[int] = []

    async def cycle() -> Lease:
        lease = await backend.acquire(resource, ttl=10, timeout=2)
        fences.append(lease.fence)
        await backend.release(lease)
        return lease

    await cycle()
    for victim in range(N):
        partner = (victim + 2) % N
        # The victim's counter runs far ahead (a fast clock, or many grants only it saw).
        await direct[victim].set(fence_key, fences[-1] + 10**10)
        lease = await cycle()
        assert lease.fence > fences[-2] + 10**10
        nodes.kill(victim, partner)  # their counters are lost; three nodes keep lease.fence
        await cycle()  # granted by exactly the three survivors
        nodes.revive(victim, partner)  # empty: INCR from 0, floored by the clock only
        await cycle()
    assert increasing(fences), fences


async def test_cancelled_acquire_strands_nothing(
    nodes: Nodes, backend: RedlockBackend, direct: list[aioredis.Redis], resource: str
) -> None:
    for steps in range(12):  # cancel at successive points of the acquire
        task = asyncio.ensure_future(backend.acquire(resource, ttl=10, timeout=1))
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await backend.release(await task)  # it finished before the cancellation landed
        assert await owners(direct, nodes, resource) == [None] * N, steps


async def test_hold_renews_over_redlock(
    nodes: Nodes, backend: RedlockBackend, direct: list[aioredis.Redis], resource: str
) -> None:
    lock = Lock(backend, resource, ttl=0.6, timeout=1)  # a renewal may be 0.4 s late
    async with lock.hold(renew_every=0.15) as lease:
        await anyio.sleep(1.2)  # twice the TTL: only the renewals keep the keys
        assert await owners(direct, nodes, resource) == [lease.token] * N
    assert await owners(direct, nodes, resource) == [None] * N


async def test_hold_is_lost_with_the_majority(
    nodes: Nodes, backend: RedlockBackend, resource: str
) -> None:
    lock = Lock(backend, resource, ttl=0.3, timeout=1)
    finished = False

    async def work_while_the_majority_dies() -> None:
        nonlocal finished
        async with lock.hold(renew_every=0.1):
            nodes.kill(0, 1, 2)
            await anyio.sleep(5)
            finished = True

    with pytest.raises(LockLost):
        await work_while_the_majority_dies()
    assert not finished
