"""What only the ZooKeeper backend shows, on the real (shared) server: its nodes, the
czxid fence, FIFO over separate sessions, cancellation leaving no node, escaped names,
the session timeout bounding the TTL."""

from __future__ import annotations

import asyncio
import collections
import itertools
import socket
import time
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from headway import BackendUnavailable, Lock, LockLost, LockNotAcquired, ZooKeeperLockBackend
from headway.lock.backends.zookeeper.paths import resource_path
from tests.lock.backends.zookeeper.conftest import backends_on
from tests.lock.test_modes import queued
from tests.servers import free_port
from tests.zookeeper_server import ZooKeeperServer

pytestmark = [pytest.mark.anyio]

Make = Callable[[], ZooKeeperLockBackend]


def nodes(kazoo: KazooClient, prefix: str, resource: str) -> list[str]:
    folder = resource_path(prefix, resource)
    return sorted(kazoo.get_children(folder)) if kazoo.exists(folder) else []


async def test_the_fence_is_the_owner_node_czxid(
    make_backend: Make, kazoo: KazooClient, zk_prefix: str
) -> None:
    backend = make_backend()
    lease = await backend.acquire("r", 5, 1)
    [name] = nodes(kazoo, zk_prefix, "r")
    _, stat = kazoo.get(f"{resource_path(zk_prefix, 'r')}/{name}")
    assert lease.fence == stat.czxid
    assert stat.ephemeralOwner != 0
    await backend.release(lease)
    # The folder recreated: the sequence suffix starts again at 0, the fence goes on up.
    kazoo.delete(resource_path(zk_prefix, "r"))
    again = await backend.acquire("r", 5, 1)
    assert nodes(kazoo, zk_prefix, "r")[0].endswith("-0000000000")
    assert again.fence > lease.fence
    await backend.release(again)


async def test_eight_sessions_are_served_in_request_order(
    make_backend: Make, kazoo: KazooClient, zk_prefix: str
) -> None:
    holder_backend, *backends = [make_backend() for _ in range(9)]
    holder = await holder_backend.acquire("q", 30, 1)
    order: list[int] = []

    async def waiter(i: int) -> None:
        lock = Lock(backends[i], "q", ttl=30, timeout=30)
        lease = await lock.acquire()
        order.append(i)
        await lock.release(lease)

    tasks = []
    async with asyncio.timeout(30):
        for i in range(8):
            tasks.append(asyncio.create_task(waiter(i)))
            # The next one asks only once this one's node is in the queue.
            while len(nodes(kazoo, zk_prefix, "q")) < i + 2:
                await asyncio.sleep(0.01)
    await holder_backend.release(holder)
    async with asyncio.timeout(30):
        await asyncio.gather(*tasks)
    assert order == list(range(8))


async def test_eight_contending_sessions_get_fifo_grants_and_fair_shares(
    make_backend: Make,
) -> None:
    backends = [make_backend() for _ in range(8)]
    grants: list[tuple[int, int]] = []  # (worker, fence), in grant order
    total = 240

    async def worker(i: int) -> None:
        lock = Lock(backends[i], "contended", ttl=10, timeout=30)
        while len(grants) < total:
            lease = await lock.acquire()
            grants.append((i, lease.fence))
            await asyncio.sleep(0)  # the critical section
            await lock.release(lease)

    async with asyncio.timeout(120):
        await asyncio.gather(*(worker(i) for i in range(8)))
    # A fence is the czxid of the node created when the request was made: fences rising
    # along the grants means every grant went to the oldest request waiting.
    fences = [fence for _, fence in grants]
    assert all(a < b for a, b in itertools.pairwise(fences))
    shares = collections.Counter(i for i, _ in grants)
    assert min(shares[i] for i in range(8)) >= 0.08 * len(grants), shares


async def test_cancelled_and_timed_out_waiters_leave_no_node(
    make_backend: Make, kazoo: KazooClient, zk_prefix: str
) -> None:
    holder_backend, backend = make_backend(), make_backend()
    holder = await holder_backend.acquire("c", 30, 1)
    waiter = asyncio.create_task(backend.acquire("c", 30, 30))
    while len(nodes(kazoo, zk_prefix, "c")) < 2:
        await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(nodes(kazoo, zk_prefix, "c")) == 1
    with pytest.raises(LockNotAcquired):
        await backend.acquire("c", 30, 0.2)
    with pytest.raises(LockNotAcquired):
        await backend.acquire("c", 30, 0)  # a single attempt
    assert len(nodes(kazoo, zk_prefix, "c")) == 1
    await holder_backend.release(holder)
    assert nodes(kazoo, zk_prefix, "c") == []


async def test_resource_names_are_escaped(
    make_backend: Make, kazoo: KazooClient, zk_prefix: str
) -> None:
    backend = make_backend()
    names = ["plain", "a/b", "..", ".", "{x}:y", "é" * 100, "z" * 65]
    for name in names:
        await backend.release(await backend.acquire(name, 5, 1))
    folders = kazoo.get_children(zk_prefix)
    assert len(set(folders)) == len(names)
    assert "plain" in folders
    assert all(f == "plain" or (f.startswith("~") and len(f) == 33) for f in folders), folders


async def test_a_ttl_longer_than_the_session_is_refused(zookeeper_hosts: str) -> None:
    backend = ZooKeeperLockBackend(zookeeper_hosts, session_timeout=5)
    with pytest.raises(ValueError, match="session timeout"):
        await backend.acquire("r", 6, 1)
    with pytest.raises(ValueError, match="prefix"):
        ZooKeeperLockBackend(zookeeper_hosts, prefix="locks/")
    await backend.aclose()


async def test_an_unreachable_ensemble_is_unavailable_within_the_timeout() -> None:
    backend = ZooKeeperLockBackend(f"127.0.0.1:{free_port()}", timeout=0.5)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable):
        await backend.acquire("r", 5, 5)
    assert time.monotonic() - started < 0.5 + 1.0  # the timeout, and a margin for the VM
    await backend.aclose()


async def test_a_session_ended_by_the_server_cancels_hold_with_lock_lost(
    make_backend: Make, zookeeper_hosts: str
) -> None:
    backend, rival = make_backend(), make_backend()
    lock = Lock(backend, "s", ttl=3)
    entered = asyncio.Event()
    lost: list[BaseException] = []

    async def holder() -> None:
        try:
            async with lock.hold(renew_every=0.2) as lease:
                entered.set()
                await asyncio.sleep(30)
        except LockLost as exc:
            lost.append(exc)
            assert lease.fence > 0

    task = asyncio.create_task(holder())
    await entered.wait()
    # End the holder's session on the server, as an expiry does: a second client
    # attached to the same session closes it, and the server deletes its nodes.
    twin = KazooClient(hosts=zookeeper_hosts, client_id=backend.client.client_id)
    twin.start(timeout=10)
    twin.stop()
    twin.close()
    async with asyncio.timeout(10):
        await task  # well before the lease (3 s) would have run out unrenewed
    assert lost
    assert "no longer held" in str(lost[0].__cause__ or lost[0])
    taken = await rival.acquire("s", 3, 5)
    await rival.release(taken)


def packets_received(server: ZooKeeperServer) -> int:
    """The packets the server has read (its ``srvr``'s "Received"); each four-letter
    command, this one too, counts as one."""
    with socket.create_connection(("127.0.0.1", server.port), 5) as sock:
        sock.sendall(b"srvr")
        text = b"".join(iter(lambda: sock.recv(4096), b"")).decode()
    [line] = [line for line in text.splitlines() if line.startswith("Received:")]
    return int(line.split()[1])


async def test_a_waiter_whose_only_predecessor_left_holds_without_a_listing(
    fast_zookeeper: ZooKeeperServer, zk_prefix: str
) -> None:
    # Sequences only rise: once the one node ahead is deleted, the waiter is the lowest.
    # So a hand-over costs the server the holder's delete alone, not also the waiter's
    # look at the queue. Pings (sessions of 2 s) may land in a window: the least of five.
    async with backends_on(fast_zookeeper.hosts, zk_prefix) as make:
        holding, waiting = Lock(make(), "h", ttl=1, timeout=5), Lock(make(), "h", ttl=1, timeout=5)
        held, seen = await holding.acquire(), []
        for _ in range(5):
            waiter = await queued(waiting, waiting.acquire)  # refused: its watch is set
            before = packets_received(fast_zookeeper)
            await holding.release(held)  # one delete
            async with asyncio.timeout(5):
                lease = await waiter
            seen.append(packets_received(fast_zookeeper) - before - 1)  # less one srvr
            held, holding, waiting = lease, waiting, holding
        await holding.release(held)
    assert min(seen) == 1, seen


async def test_a_released_holder_hands_over_to_its_sessions_waiter_without_a_listing(
    fast_zookeeper: ZooKeeperServer, zk_prefix: str
) -> None:
    # Three requests of one session: the last watches the middle one, which still had
    # the holder ahead of it when the watch was set. Once the middle one holds and
    # releases, nothing can be ahead of the last: its grant costs no listing either.
    # Pings (of any session on this server) may land in a window: the least of four.
    async with backends_on(fast_zookeeper.hosts, zk_prefix) as make:
        backend, seen = make(), collections.defaultdict(list)
        locks = [Lock(backend, "s", ttl=1, timeout=5) for _ in range(3)]
        for _ in range(4):
            held = await locks[0].acquire()
            middle = await queued(locks[1], locks[1].acquire)
            last = await queued(locks[2], locks[2].acquire)
            for turn, (holder, waiter) in enumerate(((locks[0], middle), (locks[1], last))):
                before = packets_received(fast_zookeeper)
                await holder.release(held)  # one delete
                async with asyncio.timeout(5):
                    held = await waiter
                seen[turn].append(packets_received(fast_zookeeper) - before - 1)  # less srvr
            await locks[2].release(held)
    assert [min(seen[0]), min(seen[1])] == [1, 1], seen


async def test_a_waiter_that_leaves_hands_over_nothing(
    fast_zookeeper: ZooKeeperServer, zk_prefix: str
) -> None:
    # The deletion of a node that only waited proves nothing about the nodes ahead of
    # it: the waiter behind it looks again, and keeps waiting while the holder holds.
    async with backends_on(fast_zookeeper.hosts, zk_prefix) as make:
        backend = make()
        holding = Lock(backend, "w", ttl=1, timeout=5)
        held = await holding.acquire()
        leaving = Lock(backend, "w", ttl=1, timeout=5)
        staying = Lock(backend, "w", ttl=1, timeout=5)
        gone = await queued(leaving, leaving.acquire)
        waiter = await queued(staying, staying.acquire)
        before = packets_received(fast_zookeeper)
        gone.cancel()  # its node is deleted: the staying waiter's watch fires
        with pytest.raises(asyncio.CancelledError):
            await gone
        polls = 0
        async with asyncio.timeout(5):  # the delete, its look at the queue, its new watch
            while packets_received(fast_zookeeper) - before - (polls := polls + 1) < 3:
                await asyncio.sleep(0.01)
        assert not waiter.done()
        state = await backend.inspect("w")
        assert (len(state.holders), state.waiting) == (1, 1)
        await holding.release(held)
        async with asyncio.timeout(5):
            await staying.release(await waiter)


async def test_a_waiter_cancelled_again_while_leaving_stops_listening(
    make_backend: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The second cancellation ends the leave's wait for its delete: the waiter's
    # wake-ups and its place among the successors must go all the same.
    backend = make_backend()
    held = await backend.acquire("c2", 5, 1)
    leaving = asyncio.Event()
    leave = backend._leave

    async def watched(resource: str, waiter: str) -> None:
        leaving.set()
        await leave(resource, waiter)

    monkeypatch.setattr(backend, "_leave", watched)
    lock = Lock(backend, "c2", ttl=5, timeout=30)
    waiter = await queued(lock, lock.acquire)
    waiter.cancel()
    await leaving.wait()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (backend.session.wakers, backend.session.successors) == ({}, {})
    await backend.release(held)


@pytest.mark.parametrize(("ttl", "requests"), [(1.0, 1), (2.0, 2)])
async def test_an_unlisted_grant_never_outlives_what_the_session_is_sure_of(
    fast_zookeeper: ZooKeeperServer, zk_prefix: str, ttl: float, requests: int
) -> None:
    # The session lives its timeout (2 s here) past the server's last request from it.
    # A grant on the deletion's event sends none: it is taken only if that leaves the
    # whole TTL; a lease as long as the session timeout lists the queue (a request).
    backend = ZooKeeperLockBackend(fast_zookeeper.hosts, prefix=zk_prefix, session_timeout=2)
    seen = []
    try:
        holding, waiting = (Lock(backend, "t", ttl=ttl, timeout=5) for _ in range(2))
        for _ in range(4):
            held = await holding.acquire()
            waiter = await queued(waiting, waiting.acquire)
            before = packets_received(fast_zookeeper)
            await holding.release(held)
            async with asyncio.timeout(5):
                lease = await waiter
            seen.append(packets_received(fast_zookeeper) - before - 1)  # less one srvr
            await waiting.release(lease)
    finally:
        await backend.aclose()
    assert min(seen) == requests, seen
