"""What one Redlock cycle costs each node, how its counters stay equal, and the fencing switch,
read from five real redis-servers (``INFO commandstats``, the counters' keys)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from redis import asyncio as aioredis

from headway._errors import LockNotAcquired
from headway.lock.backends.redis.keys import lock_keys
from headway.lock.backends.redlock import RedlockBackend
from tests.lock.backends.redlock.nodes import NODE_TIMEOUT, N, Nodes, owners

pytestmark = pytest.mark.anyio


async def _calls(direct: list[aioredis.Redis]) -> list[dict[str, int]]:
    """Each node's calls per command so far (the INFO reads themselves left out)."""
    found = []
    for client in direct:
        stats = await client.info("commandstats")
        found.append(
            {
                name.removeprefix("cmdstat_"): int(value["calls"])
                for name, value in stats.items()
                if name != "cmdstat_info"
            }
        )
    return found


def _spent(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


async def _counters(direct: list[aioredis.Redis], resource: str) -> list[int]:
    return [int(await client.get(lock_keys(resource).fence) or 0) for client in direct]


@pytest.mark.parametrize(
    ("fencing", "per_node"),
    [
        (True, {"fcall": 2, "set": 1, "incr": 1, "get": 1, "del": 1}),
        (False, {"fcall": 2, "set": 1, "get": 1, "del": 1}),
    ],
)
async def test_a_cycle_is_one_script_call_per_node_each_way(
    nodes: Nodes,
    direct: list[aioredis.Redis],
    resource: str,
    fencing: bool,
    per_node: dict[str, int],
) -> None:
    backend = RedlockBackend.from_urls(nodes.urls, node_timeout=NODE_TIMEOUT, fencing=fencing)
    try:
        await backend.release(await backend.acquire(resource, ttl=10, timeout=1))  # warm up
        before = await _calls(direct)
        lease = await backend.acquire(resource, ttl=10, timeout=1)
        await backend.release(lease)
        after = await _calls(direct)
    finally:
        await backend.aclose()
    # No write-back round: the counters agreed, so the grant carried the fence.
    assert [_spent(b, a) for b, a in zip(before, after, strict=True)] == [per_node] * N
    if fencing:
        assert lease.fence > 0
        assert await _counters(direct, resource) == [lease.fence] * N
    else:
        assert lease.fence == 0
        assert await _counters(direct, resource) == [0] * N  # nothing counted


async def test_a_lagging_counter_is_caught_up(
    nodes: Nodes, backend: RedlockBackend, direct: list[aioredis.Redis], resource: str
) -> None:
    first = await backend.acquire(resource, ttl=10, timeout=1)
    await backend.release(first)
    await direct[0].set(lock_keys(resource).fence, 5)  # lost grants, say
    lease = await backend.acquire(resource, ttl=10, timeout=1)
    assert lease.fence == first.fence + 1  # four of five agree: a majority counted it
    await backend.release(lease)  # runs after the catch-up on node 0's connection
    assert await _counters(direct, resource) == [lease.fence] * N


async def test_a_failed_round_leaves_the_counters_equal(
    nodes: Nodes, backend: RedlockBackend, direct: list[aioredis.Redis], resource: str
) -> None:
    first = await backend.acquire(resource, ttl=10, timeout=1)
    await backend.release(first)
    for client in direct[:3]:
        await client.set(lock_keys(resource).owner, "someone-else", px=10_000)
    with pytest.raises(LockNotAcquired, match="2/5 nodes granted it"):
        await backend.acquire(resource, ttl=10, timeout=0)
    # Two nodes counted first.fence + 1; the undo raised the three that refused to it.
    assert await _counters(direct, resource) == [first.fence + 1] * N
    for client in direct[:3]:
        await client.delete(lock_keys(resource).owner)
    again = await backend.acquire(resource, ttl=10, timeout=1)
    assert again.fence == first.fence + 2
    await backend.release(again)


@contextmanager
def stopped(nodes: Nodes, *indexes: int) -> Iterator[None]:
    """Nodes that take requests and never answer (SIGSTOP), resumed on exit."""
    for i in indexes:
        os.kill(nodes.nodes[i].pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for i in indexes:
            os.kill(nodes.nodes[i].pid, signal.SIGCONT)


async def test_silent_nodes_cost_one_node_timeout(
    nodes: Nodes, backend: RedlockBackend, direct: list[aioredis.Redis], resource: str
) -> None:
    await backend.release(await backend.acquire(resource, ttl=10, timeout=1))  # connected
    with stopped(nodes, 0, 1):
        started = time.monotonic()
        lease = await backend.acquire(resource, ttl=10, timeout=1)
        assert time.monotonic() - started < 2 * NODE_TIMEOUT + 0.5
        await backend.release(lease)
    with stopped(nodes, 0, 1, 2):
        started = time.monotonic()
        with pytest.raises(LockNotAcquired, match="did not answer within") as caught:
            await backend.acquire(resource, ttl=10, timeout=0.3)
        assert time.monotonic() - started < 0.3 + 2 * NODE_TIMEOUT + 0.5
        assert "2/5 nodes granted it" in str(caught.value)
    # Resumed, the nodes run the late calls in order, each undo after its grant: a cycle
    # queued behind them on the same connections finds nothing left over.
    await backend.release(await backend.acquire(resource, ttl=10, timeout=2))
    assert await owners(direct, nodes, resource) == [None] * N


class _NoCatchUp(RedlockBackend):
    """Without the unawaited catch-up, only the grant and the write-back raise counters."""

    def _catch_up(self, resource: str, fence: int, current: set[int]) -> None:
        pass


async def test_a_fence_held_by_a_minority_is_written_back_first(
    nodes: Nodes, direct: list[aioredis.Redis], resource: str
) -> None:
    backend = _NoCatchUp.from_urls(nodes.urls, node_timeout=NODE_TIMEOUT)
    try:
        first = await backend.acquire(resource, ttl=10, timeout=1)
        await backend.release(first)
        await direct[0].set(lock_keys(resource).fence, first.fence + 10**10)  # node 0 ahead
        ahead = await backend.acquire(resource, ttl=10, timeout=1)
        assert ahead.fence == first.fence + 10**10 + 1  # only node 0 counted that
        await backend.release(ahead)
        nodes.kill(0, 1)  # the three left must have been raised before `ahead` was returned
        after = await backend.acquire(resource, ttl=10, timeout=1)
        assert after.fence > ahead.fence
        await backend.release(after)
    finally:
        await backend.aclose()
