"""Read-write locks and semaphores on the real (shared) ZooKeeper: the nodes they leave,
the czxid fence, waiters woken by watches alone whatever order the nodes ahead vanish
in (kazoo's read-write lock deadlocked in one: issue 649), a crashed holder's node gone
with its session; and, on a throw-away server that answers ``wchc``, the watches each
waiter leaves on the server: only on what it must wait for."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import pytest
from kazoo.client import KazooClient

from headway import Lease, Lock, LockNotAcquired, ZooKeeperLockBackend
from headway.lock import flow
from headway.lock.backends.zookeeper.paths import family_path, sequence
from headway.lock.modes import READ, WRITE, LockMode, fits, permits
from headway.lock.shared import ReadWriteLock, Semaphore
from tests.lock.backends.zookeeper.conftest import backends_on
from tests.lock.test_modes import queued
from tests.zookeeper_server import ZooKeeperServer

pytestmark = [pytest.mark.anyio]

Make = Callable[[], ZooKeeperLockBackend]


def nodes(kazoo: KazooClient, prefix: str, resource: str, family: str) -> list[str]:
    """The family's nodes in queue order."""
    folder = family_path(prefix, resource, family)
    return sorted(kazoo.get_children(folder), key=sequence) if kazoo.exists(folder) else []


async def until_nodes(kazoo: KazooClient, prefix: str, resource: str, family: str, n: int) -> None:
    """Return once the family has ``n`` nodes on the server."""
    async with asyncio.timeout(10):
        while len(nodes(kazoo, prefix, resource, family)) != n:
            await asyncio.sleep(0.01)


@pytest.fixture
def woken_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiter not woken by a watch waits past the test's bounds instead of retrying."""
    monkeypatch.setattr(flow, "WAIT_CAP", 60.0)


async def test_fences_are_czxids_and_keep_rising_when_the_folder_is_made_again(
    make_backend: Make, kazoo: KazooClient, zk_prefix: str
) -> None:
    backend = make_backend()
    rw = ReadWriteLock(backend, "doc", ttl=5, timeout=1)
    semaphore = Semaphore(backend, "doc", permits=3, ttl=5, timeout=1)
    reader, permit = await rw.read.acquire(), await semaphore.acquire()
    [read_node] = nodes(kazoo, zk_prefix, "doc", "rw")
    [permit_node] = nodes(kazoo, zk_prefix, "doc", "permits")
    assert read_node == f"read-{reader.token}-0000000000"
    assert permit_node == f"permit-3-{permit.token}-0000000000"
    _, stat = kazoo.get(f"{family_path(zk_prefix, 'doc', 'rw')}/{read_node}")
    assert reader.fence == stat.czxid
    assert stat.ephemeralOwner != 0
    await rw.read.release(reader)
    await semaphore.release(permit)
    for family in ("rw", "permits"):
        kazoo.delete(family_path(zk_prefix, "doc", family))
    writer, again = await rw.write.acquire(), await semaphore.acquire()
    assert nodes(kazoo, zk_prefix, "doc", "rw")[0].endswith("-0000000000")
    assert writer.fence > reader.fence
    assert again.fence > permit.fence
    await rw.write.release(writer)
    await semaphore.release(again)


@pytest.mark.parametrize("how", ["cancelled", "timed out", "single attempt"])
async def test_waiters_that_give_up_leave_no_node(
    make_backend: Make, kazoo: KazooClient, zk_prefix: str, how: str
) -> None:
    holder, backend = make_backend(), make_backend()
    rw_held = ReadWriteLock(holder, "doc", ttl=30, timeout=1)
    writer = await rw_held.write.acquire()
    permit = await Semaphore(holder, "pool", permits=1, ttl=30).acquire()
    rw = ReadWriteLock(backend, "doc", ttl=30, timeout=30)
    locks = [
        (rw.read, "doc", "rw"),
        (rw.write, "doc", "rw"),
        (Semaphore(backend, "pool", permits=1, ttl=30, timeout=30), "pool", "permits"),
    ]
    for lock, resource, family in locks:
        if how == "cancelled":
            task = asyncio.create_task(lock.acquire())
            await until_nodes(kazoo, zk_prefix, resource, family, 2)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        else:
            with pytest.raises(LockNotAcquired):
                await lock.acquire(timeout=0.2 if how == "timed out" else 0)
        assert len(nodes(kazoo, zk_prefix, resource, family)) == 1
    await rw_held.write.release(writer)
    await Semaphore(holder, "pool", permits=1).release(permit)
    assert nodes(kazoo, zk_prefix, "doc", "rw") == []
    assert nodes(kazoo, zk_prefix, "pool", "permits") == []


def _granted(queue: list[tuple[int, LockMode]]) -> set[int]:
    """The rule of ``lock.modes`` over the requests still queued (no lapsed holders)."""
    granted: set[int] = set()
    ahead: list[int] = []
    capacity = queue[-1][1].capacity if queue else 0  # the newest request's
    for i, mode in queue:
        if fits([], ahead, mode.weight, capacity):
            granted.add(i)
        ahead.append(mode.weight)
    return granted


R, W = READ, WRITE
SCRIPTS = {
    # request modes in arrival order; the order in which they vanish (release or cancel)
    "fifo": ([W, R, W, R, R, W], [0, 1, 2, 3, 4, 5]),
    # kazoo issue 649: the first writer leaves while a reader waits before a writer
    "649": ([W, R, W], [0, 1, 2]),
    "middle writer cancelled first": ([W, R, W, R, R, W], [2, 0, 1, 4, 3, 5]),
    "from the back": ([W, R, W, R, R, W], [5, 4, 3, 2, 1, 0]),
    "readers out of order": ([R, R, W, R, W, R], [1, 3, 0, 4, 2, 5]),
    "reader cancelled before the writer": ([W, R, W, R], [1, 0, 3, 2]),
    "permits released out of order": ([permits(2)] * 6, [1, 3, 0, 5, 2, 4]),
    "permits from the back": ([permits(2)] * 5, [4, 3, 0, 2, 1]),
}


@pytest.mark.usefixtures("woken_only")
@pytest.mark.parametrize("script", SCRIPTS.keys())
async def test_waiters_are_woken_whatever_order_the_nodes_ahead_vanish_in(
    make_backend: Make, kazoo: KazooClient, zk_prefix: str, script: str
) -> None:
    modes, vanish = SCRIPTS[script]
    family = modes[0].family
    tasks: list[asyncio.Task[Lease]] = []
    locks: list[Lock] = []
    queue: list[tuple[int, LockMode]] = []
    for i, mode in enumerate(modes):  # one session each, queued in this order
        lock = Lock(make_backend().for_mode(mode), "r", ttl=30, timeout=60)
        locks.append(lock)
        tasks.append(asyncio.create_task(lock.acquire()))
        queue.append((i, mode))
        await until_nodes(kazoo, zk_prefix, "r", family, i + 1)
    for gone in [None, *vanish]:
        if gone is not None:
            queue = [(i, mode) for i, mode in queue if i != gone]
            if tasks[gone].done():
                await locks[gone].release(tasks[gone].result())
            else:
                tasks[gone].cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await tasks[gone]
        expected = _granted(queue)
        async with asyncio.timeout(10):  # woken by watches alone: WAIT_CAP is 60 s
            await asyncio.gather(*(tasks[i] for i in expected))
        await asyncio.sleep(0.05)  # a wrong grant would have been made by now
        assert {i for i, _ in queue if tasks[i].done()} == expected, (gone, queue)
    fences = [task.result().fence for task in tasks if not task.cancelled()]
    assert fences == sorted(fences)
    assert nodes(kazoo, zk_prefix, "r", family) == []


@pytest.mark.usefixtures("woken_only")
async def test_a_crashed_holders_node_goes_with_its_session(
    make_backend: Make, kazoo: KazooClient, zk_prefix: str
) -> None:
    crashed, backend = make_backend(), make_backend()
    writer = await ReadWriteLock(crashed, "doc", ttl=30).write.acquire()
    permit = await Semaphore(crashed, "pool", permits=1, ttl=30).acquire()
    rw = ReadWriteLock(backend, "doc", ttl=30, timeout=30)
    semaphore = Semaphore(backend, "pool", permits=1, ttl=30, timeout=30)
    waiting = [asyncio.create_task(rw.read.acquire()), asyncio.create_task(semaphore.acquire())]
    await until_nodes(kazoo, zk_prefix, "doc", "rw", 2)
    await until_nodes(kazoo, zk_prefix, "pool", "permits", 2)
    # End the holder's session on the server, as an expiry does: a second client
    # attached to the same session closes it, and the server deletes its nodes.
    twin = KazooClient(hosts=crashed.hosts, client_id=crashed.client.client_id)
    twin.start(timeout=10)
    twin.stop()
    twin.close()
    async with asyncio.timeout(10):
        reader, taken = await asyncio.gather(*waiting)
    assert reader.fence > writer.fence
    assert taken.fence > permit.fence
    await rw.read.release(reader)
    await semaphore.release(taken)


def server_watches(server: ZooKeeperServer) -> dict[int, set[str]]:
    """The data watches the server holds, by session id: its ``wchc`` command.

    Asked of the server rather than of kazoo's registries: what the server keeps is
    what it will fire, and so who a delete wakes. ``wchc`` is off by default (it walks
    every watch); the throw-away server's whitelist enables it (``zookeeper_server``).
    """
    with socket.create_connection(("127.0.0.1", server.port), 5) as sock:
        sock.sendall(b"wchc")
        text = b"".join(iter(lambda: sock.recv(4096), b"")).decode()
    assert "not in the whitelist" not in text, text
    watched: dict[int, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("0x"):
            session = watched.setdefault(int(line, 16), set())
        elif line.strip():
            session.add(line.strip())
    return watched


@pytest.fixture
async def make_fast_backend(fast_zookeeper: ZooKeeperServer, zk_prefix: str) -> AsyncIterator[Make]:
    """Backends (one session each) on the throw-away server, whose ``wchc`` answers.
    Its sessions are capped at 2 s (20 ticks); kazoo pings within them."""
    async with backends_on(fast_zookeeper.hosts, zk_prefix) as make:
        yield make


async def queue_waiters(
    make: Make, kinds: list[str]
) -> tuple[list[int], list[Lock], list[asyncio.Task[Lease]]]:
    """A waiter of each kind ("read", "write", or a permit of 2), one session each, in
    this order: their session ids, locks and acquiring tasks, each refused (watching)."""
    sessions, locks, tasks = [], [], []
    for kind in kinds:
        backend = make()
        rw = ReadWriteLock(backend, "doc", ttl=30, timeout=30)
        lock = {"read": rw.read, "write": rw.write}.get(kind)
        lock = lock or Semaphore(backend, "pool", permits=2, ttl=30, timeout=30)
        tasks.append(await queued(lock, lock.acquire))  # refused: its watches are set
        sessions.append(backend.client.client_id[0])
        locks.append(lock)
    return sessions, locks, tasks


@pytest.mark.usefixtures("woken_only")
async def test_each_waiter_watches_only_what_it_waits_for(
    make_fast_backend: Make, fast_zookeeper: ZooKeeperServer, zk_prefix: str
) -> None:
    holder = make_fast_backend()
    rw, semaphore = ReadWriteLock(holder, "doc", ttl=30), Semaphore(holder, "pool", permits=2)
    writer, permits_held = await rw.write.acquire(), [await semaphore.acquire() for _ in "12"]
    kinds = ["read", "read", "write", "read", "write", "permits", "permits"]
    sessions, locks, waiting = await queue_waiters(make_fast_backend, kinds)
    rw_nodes, pool_nodes = (
        nodes_at(holder, family_path(zk_prefix, resource, family))
        for resource, family in [("doc", "rw"), ("pool", "permits")]
    )
    expected = [
        {rw_nodes[0]},  # a reader: the nearest writer ahead (the holder)
        {rw_nodes[0]},  # the next reader too, not the reader just ahead
        {rw_nodes[2]},  # a writer: the node just ahead (the second reader)
        {rw_nodes[3]},  # a reader: the nearest writer ahead
        {rw_nodes[4]},  # a writer: the node just ahead
        set(pool_nodes[:2]),  # a permit of 2: the 2 nodes ahead (both holders)
        set(pool_nodes[1:3]),  # the next: the 2 just ahead of it, not the first holder
    ]
    watched = server_watches(fast_zookeeper)
    assert [watched.get(session, set()) for session in sessions] == expected
    assert watched.get(holder.client.client_id[0], set()) == set()
    # The writer leaves: only the two readers that watched it wake (and enter); the
    # others keep the one watch they had, and nobody else was woken to set one again.
    await rw.write.release(writer)
    async with asyncio.timeout(10):
        readers = await asyncio.gather(*waiting[:2])
    watched = server_watches(fast_zookeeper)
    assert [watched.get(session, set()) for session in sessions] == [set(), set(), *expected[2:]]
    assert not any(task.done() for task in waiting[2:])
    for task in waiting[2:]:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for lock, lease in [
        *zip(locks[:2], readers, strict=True),
        *((semaphore, p) for p in permits_held),
    ]:
        await lock.release(lease)


def nodes_at(backend: ZooKeeperLockBackend, folder: str) -> list[str]:
    """The paths of the request nodes in ``folder`` in queue order (``backend``'s client)."""
    return [
        f"{folder}/{name}" for name in sorted(backend.client.get_children(folder), key=sequence)
    ]
