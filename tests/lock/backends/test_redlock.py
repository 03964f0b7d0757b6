"""Redlock over five real redis-server processes, some of them killed mid-test."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest
from redis import asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from headway import Lease, Lock
from headway._errors import LockLost, LockNotAcquired, LockNotOwned
from headway.lock.backends.redis.keys import lock_keys
from headway.lock.backends.redlock import RedlockBackend
from headway.lock.lease import new_token
from tests.servers import RedisServers, Server

pytestmark = pytest.mark.anyio

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


@pytest.fixture(scope="module")
def redlock_nodes(redis_servers: RedisServers) -> Iterator[Nodes]:
    nodes = Nodes(redis_servers)
    try:
        yield nodes
    finally:
        for node in nodes.nodes:
            redis_servers.stop(node)


@pytest.fixture
def nodes(redlock_nodes: Nodes) -> Nodes:
    """The five nodes, every one of them up (a test may have killed some)."""
    redlock_nodes.heal()
    return redlock_nodes


@pytest.fixture
async def backend(nodes: Nodes) -> AsyncIterator[RedlockBackend]:
    redlock = RedlockBackend.from_urls(
        nodes.urls, node_timeout=NODE_TIMEOUT, retry_delay=(0.001, 0.01)
    )
    try:
        yield redlock
    finally:
        await redlock.aclose()


@pytest.fixture
async def direct(nodes: Nodes) -> AsyncIterator[list[aioredis.Redis]]:
    """One plain client per node, to look at (and tamper with) what Redlock wrote."""
    clients = [
        aioredis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=1)
        for url in nodes.urls
    ]
    try:
        yield clients
    finally:
        for client in clients:
            await client.aclose()


@pytest.fixture
def resource() -> str:
    return f"redlock-{uuid.uuid4().hex}"


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
_LOOP_TEARDOWN = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def count_exclusively(
    urls: list[str], threads: int, tasks: int, rounds: int
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
            urls, node_timeout=NODE_TIMEOUT, retry_delay=(0.001, 0.01)
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


@_LOOP_TEARDOWN
def test_mutual_exclusion_counted_exactly(nodes: Nodes) -> None:
    count, fences = count_exclusively(nodes.urls, threads=4, tasks=2, rounds=25)
    assert count == 200
    assert len(fences) == 200
    assert increasing(fences)


@_LOOP_TEARDOWN
def test_two_of_five_down_still_grants_and_excludes(nodes: Nodes) -> None:
    nodes.kill(0, 3)
    count, fences = count_exclusively(nodes.urls, threads=2, tasks=2, rounds=10)
    assert count == 40
    assert increasing(fences)


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
