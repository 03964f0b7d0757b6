"""Redlock's ``inspect``: the holder a majority of nodes agree on, or none."""

from __future__ import annotations

import pytest
from redis import asyncio as aioredis

from headway import BackendUnavailable, Lock
from headway.lock.backends.redis.keys import lock_keys
from headway.lock.backends.redlock import RedlockBackend
from tests.lock.backends.redlock.nodes import Nodes

pytestmark = pytest.mark.anyio


async def test_the_majoritys_holder_is_reported(
    backend: RedlockBackend, direct: list[aioredis.Redis], resource: str
) -> None:
    lock = Lock(backend, resource, ttl=10, owner="node-a")
    lease = await lock.acquire()
    owner = lock_keys(resource).owner
    # Two of five nodes tell of a rival (a round that lost): the majority still holds.
    for client in direct[:2]:
        await client.set(owner, "rival", px=10_000)
    [holder] = (await lock.inspect()).holders
    assert (holder.fence, holder.owner) == (lease.fence, "node-a")
    assert holder.expires_in is not None
    assert 0 < holder.expires_in <= 10
    # A third node tells of another: no token has a majority, so nobody holds the lock.
    await direct[2].set(owner, "another", px=10_000)
    assert not (await lock.inspect()).held


async def test_no_majority_answering_is_unavailable(nodes: Nodes, resource: str) -> None:
    nodes.kill(0, 1, 2)
    backend = RedlockBackend.from_urls(nodes.urls, node_timeout=0.1)
    try:
        with pytest.raises(BackendUnavailable, match="2/5 nodes answered"):
            await backend.inspect(resource)
    finally:
        await backend.aclose()
