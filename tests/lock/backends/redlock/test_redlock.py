"""Redlock's grants over five real redis-servers: what every node holds, quorum, ownership."""

from __future__ import annotations

import dataclasses
import time

import pytest
from redis import asyncio as aioredis

from headway._errors import LockNotAcquired, LockNotOwned
from headway.lock.backends.redis.keys import lock_keys
from headway.lock.backends.redlock import RedlockBackend
from headway.lock.lease import new_token
from tests.lock.backends.redlock.nodes import (
    NODE_TIMEOUT,
    N,
    Nodes,
    owners,
)

pytestmark = pytest.mark.anyio


async def test_acquire_extend_release(
    nodes: Nodes, backend: RedlockBackend, direct: list[aioredis.Redis], resource: str
) -> None:
    lease = await backend.acquire(resource, ttl=10, timeout=1)
    assert backend.name == "redlock"
    assert lease.resource == resource
    assert lease.ttl == 10
    assert await owners(direct, nodes, resource) == [lease.token] * N
    # The write-back raised every node's counter to the lease's fence.
    for client in direct:
        counter = await client.get(lock_keys(resource).fence)
        assert counter is not None
        assert int(counter) >= lease.fence

    before = time.monotonic()
    longer = await backend.extend(lease, 20)
    assert (longer.token, longer.fence, longer.ttl) == (lease.token, lease.fence, 20)
    assert before < longer.deadline <= before + 20
    for client in direct:
        assert 10_000 < await client.pttl(lock_keys(resource).owner) <= 20_000

    await backend.release(longer)
    assert await owners(direct, nodes, resource) == [None] * N
    again = await backend.acquire(resource, ttl=10, timeout=1)
    assert again.fence > lease.fence
    assert again.token != lease.token
    await backend.release(again)


async def test_lease_never_outlives_its_keys(
    nodes: Nodes, backend: RedlockBackend, direct: list[aioredis.Redis], resource: str
) -> None:
    before = time.monotonic()
    lease = await backend.acquire(resource, ttl=10, timeout=1)
    assert before < lease.deadline <= before + 10
    for client in direct:
        asked = time.monotonic()
        pttl = await client.pttl(lock_keys(resource).owner)
        assert lease.deadline <= asked + pttl / 1000
    await backend.release(lease)


@pytest.mark.parametrize("down", [3, 5])
async def test_no_majority_grants_nothing_within_timeout(
    nodes: Nodes,
    backend: RedlockBackend,
    direct: list[aioredis.Redis],
    resource: str,
    down: int,
) -> None:
    nodes.kill(*range(down))
    started = time.monotonic()
    with pytest.raises(LockNotAcquired) as caught:
        await backend.acquire(resource, ttl=10, timeout=0.5)
    assert time.monotonic() - started < 0.5 + 1  # bounded by the timeout, not by the nodes
    assert caught.value.resource == resource
    message = str(caught.value)
    assert f"{N - down}/{N} nodes granted it (quorum 3)" in message
    assert message.count("ConnectionError") == down
    assert f"127.0.0.1:{nodes.nodes[0].port}" in message
    # What the live nodes granted was given back.
    assert await owners(direct, nodes, resource) == ["down"] * down + [None] * (N - down)


async def test_a_short_round_is_undone_everywhere(
    nodes: Nodes, backend: RedlockBackend, direct: list[aioredis.Redis], resource: str
) -> None:
    owner = lock_keys(resource).owner
    for client in direct[:2]:
        await client.set(owner, "someone-else", px=10_000)
    lease = await backend.acquire(resource, ttl=10, timeout=0)  # 3 of 5 is a majority
    assert await owners(direct, nodes, resource) == ["someone-else"] * 2 + [lease.token] * 3
    await backend.release(lease)
    assert await owners(direct, nodes, resource) == ["someone-else"] * 2 + [None] * 3

    await direct[2].set(owner, "someone-else", px=10_000)
    with pytest.raises(LockNotAcquired, match="2/5 nodes granted it"):
        await backend.acquire(resource, ttl=10, timeout=0.05)
    assert await owners(direct, nodes, resource) == ["someone-else"] * 3 + [None] * 2


async def test_other_client_cannot_release_or_extend(
    nodes: Nodes, backend: RedlockBackend, direct: list[aioredis.Redis], resource: str
) -> None:
    lease = await backend.acquire(resource, ttl=10, timeout=1)
    other = RedlockBackend.from_urls(nodes.urls, node_timeout=NODE_TIMEOUT)
    try:
        forged = dataclasses.replace(lease, token=new_token())
        with pytest.raises(LockNotOwned, match="0/5 nodes hold the lease"):
            await other.release(forged)
        with pytest.raises(LockNotOwned):
            await other.extend(forged, 60)
        assert await owners(direct, nodes, resource) == [lease.token] * N
        for client in direct:
            assert await client.pttl(lock_keys(resource).owner) <= 10_000

        await backend.release(lease)
        newer = await other.acquire(resource, ttl=10, timeout=1)
        with pytest.raises(LockNotOwned):
            await backend.release(lease)
        with pytest.raises(LockNotOwned):
            await backend.extend(lease, 60)
        assert await owners(direct, nodes, resource) == [newer.token] * N
        for client in direct:
            assert await client.pttl(lock_keys(resource).owner) <= 10_000
        await other.release(newer)
    finally:
        await other.aclose()


def test_arguments_are_checked() -> None:
    client = aioredis.Redis()
    with pytest.raises(ValueError, match="at least one"):
        RedlockBackend([])
    with pytest.raises(ValueError, match="node_timeout"):
        RedlockBackend([client], node_timeout=0)
    with pytest.raises(ValueError, match="drift_factor"):
        RedlockBackend([client], drift_factor=1)
    with pytest.raises(ValueError, match="retry_delay"):
        RedlockBackend([client], retry_delay=(0.2, 0.1))
    assert RedlockBackend([client] * 4).quorum == 3
