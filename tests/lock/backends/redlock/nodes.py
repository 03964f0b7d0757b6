"""Five throw-away redis-servers for Redlock, and what the tests read from them."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest
from redis import asyncio as aioredis

from headway.lock.backends.redis.keys import lock_keys
from headway.lock.backends.redlock import RedlockBackend
from tests.servers import RedisServers, Server

N = 5
# Generous per-node timeout: the test machine is shared, and a slow node only costs a retry.
NODE_TIMEOUT = 0.25


class Nodes:
    """Five redis-servers; killed ones come back empty (no persistence) on the same port."""

    def __init__(self, servers: RedisServers) -> None:
        self.servers = servers
        self.nodes: list[Server] = [servers.start() for _ in range(N)]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def kill(self, *indexes: int) -> None:
        for i in indexes:
            self.servers.stop(self.nodes[i])

    def revive(self, *indexes: int) -> None:
        for i in indexes:
            if not self.nodes[i].alive():
                self.nodes[i] = self.servers.start(port=self.nodes[i].port)

    def heal(self) -> None:
        self.revive(*range(N))


async def owners(direct: list[aioredis.Redis], nodes: Nodes, resource: str) -> list[str | None]:
    """Each node's holder token ("down" for a killed node)."""
    key = lock_keys(resource).owner
    found: list[str | None] = []
    for client, node in zip(direct, nodes.nodes, strict=True):
        if not node.alive():
            found.append("down")
            continue
        value = await client.get(key)
        found.append(value.decode() if isinstance(value, bytes) else value)
    return found


def increasing(fences: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(fences))


# Each thread's event loop ends right after its rounds; redis-py drops a connection whose
# request a per-node timeout cancelled without awaiting its close, so on a loaded machine a
# transport can still be open when that loop is torn down. That is the client's cleanup, not
# a leak of ours: don't let its ResourceWarning fail the count.
LOOP_TEARDOWN = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def count_exclusively(
    urls: list[str], threads: int, tasks: int, rounds: int, fencing: bool = True
) -> tuple[int, list[int]]:
    """Increment a counter non-atomically under the lock; return it and the fences in order.

    Each thread is a separate client (its own event loop and connections) running
    ``tasks`` tasks, so requests from rivals interleave at every node and split votes
    happen, as they do between processes.
    """
    resource = f"redlock-{uuid.uuid4().hex}"
    count = 0
    fences: list[int] = []

    async def worker(backend: RedlockBackend) -> None:
        nonlocal count
        for _ in range(rounds):
            lease = await backend.acquire(resource, ttl=5, timeout=20)
            seen = count
            await asyncio.sleep(0)  # let every other task and thread run between read and write
            count = seen + 1
            fences.append(lease.fence)
            await backend.release(lease)

    async def client() -> None:
        backend = RedlockBackend.from_urls(
            urls, node_timeout=NODE_TIMEOUT, retry_delay=(0.001, 0.01), fencing=fencing
        )
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(tasks):
                    tg.start_soon(worker, backend)
        finally:
            await backend.aclose()

    with ThreadPoolExecutor(threads) as pool:
        for done in [pool.submit(asyncio.run, client()) for _ in range(threads)]:
            done.result()
    return count, fences
