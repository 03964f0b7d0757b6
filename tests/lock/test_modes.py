"""``ReadWriteLock`` and ``Semaphore`` over every entry of ``LOCK_BACKENDS`` (conftest)
that offers ``modes``, and the refusal of every entry that lacks them."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from headway import Lease, Lock, LockNotAcquired, LockNotOwned
from headway.lock import flow
from headway.lock.contract import ModalLockBackend
from headway.lock.shared import ReadWriteLock, Semaphore
from tests.lock.conftest import LOCK_BACKENDS

pytestmark = pytest.mark.anyio

#: The entries of the shared table that offer no modes: each must refuse them.
WITHOUT_MODES = [name for name, entry in LOCK_BACKENDS.items() if "modes" in entry.lacks]


async def queued(
    lock: Lock, start: Callable[[], Coroutine[Any, Any, Lease]]
) -> asyncio.Task[Lease]:
    """Start ``start()`` in a task and return once its request holds a place in line.

    Queued backends are watched through the driver's ``_attempt`` (the first refused
    attempt queues the waiter); a backend whose server keeps the line says how many
    requests are in it, ``waiting(resource)``, which must rise.
    """
    backend: Any = lock.backend
    if not hasattr(backend, "_attempt"):
        return await _queued_by_count(lock, start)
    refused = asyncio.Event()
    original = backend._attempt
    # Only the new request's attempts count: a waiter queued earlier retries too.
    ours = contextvars.ContextVar("ours", default=False)

    async def watched(*args: Any) -> Any:
        attempt = await original(*args)
        if not attempt.granted and ours.get():
            refused.set()
        return attempt

    async def marked() -> Lease:
        ours.set(True)
        return await start()

    backend._attempt = watched
    try:
        task = asyncio.create_task(marked())
        waiting = asyncio.create_task(refused.wait())
        await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        assert not task.done(), "the request was answered instead of queued"
    finally:
        backend._attempt = original
    return task


async def _queued_by_count(
    lock: Lock, start: Callable[[], Coroutine[Any, Any, Lease]]
) -> asyncio.Task[Lease]:
    # The line is server state, with no event to wait for: polled.
    backend: Any = lock.backend

    async def waiting() -> int:
        if hasattr(backend, "waiting"):
            return int(await backend.waiting(lock.resource))
        return (await backend.inspect(lock.resource)).waiting  # type: ignore[no-any-return]

    before = await waiting()
    task = asyncio.create_task(start())
    while await waiting() <= before:
        assert not task.done(), "the request was answered instead of queued"
        await asyncio.sleep(0.005)
    assert not task.done(), "the request was answered instead of queued"
    return task


async def test_readers_share_and_a_writer_is_alone(modal_backend: ModalLockBackend) -> None:
    rw = ReadWriteLock(modal_backend, "doc", ttl=10, timeout=0)
    first, second = await rw.read.acquire(), await rw.read.acquire()
    with pytest.raises(LockNotAcquired):
        await rw.write.acquire()
    await rw.read.release(first)
    await rw.read.release(second)
    writer = await rw.write.acquire()
    with pytest.raises(LockNotAcquired):
        await rw.read.acquire()
    with pytest.raises(LockNotAcquired):
        await rw.write.acquire()
    await rw.write.release(writer)
    reader = await rw.read.acquire()
    assert first.fence < second.fence < writer.fence < reader.fence
    await rw.read.release(reader)


@pytest.fixture
def woken_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiters wait longer than the test's bound unless a release wakes them: a waiter
    that is not woken fails the test instead of moving on after ``WAIT_CAP``."""
    monkeypatch.setattr(flow, "WAIT_CAP", 60.0)


@pytest.mark.usefixtures("woken_only")
async def test_a_waiting_writer_stops_later_readers(modal_backend: ModalLockBackend) -> None:
    rw = ReadWriteLock(modal_backend, "doc", ttl=30, timeout=30)
    reader = await rw.read.acquire()
    writer_task = await queued(rw.write, rw.write.acquire)
    # A reader arriving now would share with the holder, but the writer came first.
    with pytest.raises(LockNotAcquired):
        await rw.read.acquire(timeout=0)
    late_readers = [await queued(rw.read, rw.read.acquire) for _ in range(2)]
    await rw.read.release(reader)
    writer = await writer_task
    assert not any(task.done() for task in late_readers)
    await rw.write.release(writer)
    # Readers queued together behind the writer enter together: both are woken.
    async with asyncio.timeout(10):
        leases = await asyncio.gather(*late_readers)
    assert all(lease.fence > writer.fence > reader.fence for lease in leases)
    for lease in leases:
        await rw.read.release(lease)


async def test_readers_and_writers_never_overlap_counted(modal_backend: ModalLockBackend) -> None:
    rw = ReadWriteLock(modal_backend, "counted", ttl=10, timeout=30)
    readers = writers = 0
    overlaps: list[str] = []
    entered = {"read": 0, "write": 0}
    last_writer_fence = 0

    async def worker(i: int) -> None:
        nonlocal readers, writers, last_writer_fence
        for round_ in range(6):
            write = (i + round_) % 4 == 0
            lock = rw.write if write else rw.read
            lease = await lock.acquire()
            if write:
                writers += 1
                if writers > 1 or readers:
                    overlaps.append(f"writer {lease.fence} with {writers - 1} w, {readers} r")
                assert lease.fence > last_writer_fence
                last_writer_fence = lease.fence
            else:
                readers += 1
                if writers:
                    overlaps.append(f"reader {lease.fence} with a writer")
                assert lease.fence > last_writer_fence
            entered["write" if write else "read"] += 1
            await asyncio.sleep(0.002)
            if write:
                writers -= 1
            else:
                readers -= 1
            await lock.release(lease)

    await asyncio.gather(*(worker(i) for i in range(8)))
    assert overlaps == []
    assert entered == {"write": 12, "read": 36}


async def test_semaphore_grants_its_permits_then_refuses(modal_backend: ModalLockBackend) -> None:
    semaphore = Semaphore(modal_backend, "pool", permits=3, ttl=10, timeout=0)
    leases = [await semaphore.acquire() for _ in range(3)]
    assert len({lease.token for lease in leases}) == 3
    assert leases[0].fence < leases[1].fence < leases[2].fence
    with pytest.raises(LockNotAcquired):
        await semaphore.acquire()
    await semaphore.release(leases[0])
    fourth = await semaphore.acquire()
    assert fourth.fence > leases[2].fence
    with pytest.raises(LockNotOwned):
        await semaphore.release(leases[0])
    for lease in [*leases[1:], fourth]:
        await semaphore.release(lease)


@pytest.mark.usefixtures("woken_only")
async def test_semaphore_waiters_are_served_in_arrival_order(
    modal_backend: ModalLockBackend,
) -> None:
    semaphore = Semaphore(modal_backend, "pool", permits=2, ttl=30, timeout=30)
    held = [await semaphore.acquire(), await semaphore.acquire()]
    granted: list[tuple[int, int]] = []  # (fence, waiter): fences rise in grant order

    async def waiter(i: int) -> Lease:
        lease = await semaphore.acquire()
        granted.append((lease.fence, i))
        return lease

    def order() -> list[int]:
        # By fence, not by when each task resumed: two waiters granted by two releases
        # in a row may resume in either order (each is told by its own message).
        return [i for _, i in sorted(granted)]

    tasks = [await queued(semaphore, lambda i=i: waiter(i)) for i in range(4)]  # type: ignore[misc]
    first_two = []
    for i, lease in enumerate(held):  # one permit back at a time: the next waiter's
        await semaphore.release(lease)
        async with asyncio.timeout(10):
            first_two.append(await tasks[i])
        assert order() == [0, 1][: i + 1]
        assert not any(task.done() for task in tasks[i + 1 :])
    for lease in first_two:
        await semaphore.release(lease)
    async with asyncio.timeout(10):
        last_two = await asyncio.gather(tasks[2], tasks[3])
    for lease in last_two:
        await semaphore.release(lease)
    assert sorted(order()) == [0, 1, 2, 3]


async def test_semaphore_permits_can_change_without_losing_holders(
    modal_backend: ModalLockBackend,
) -> None:
    two = Semaphore(modal_backend, "pool", permits=2, ttl=10, timeout=0)
    held = [await two.acquire(), await two.acquire()]
    three = Semaphore(modal_backend, "pool", permits=3, ttl=10, timeout=0)
    held.append(await three.acquire())  # raised to 3: a third holder fits
    one = Semaphore(modal_backend, "pool", permits=1, ttl=10, timeout=0)
    with pytest.raises(LockNotAcquired):
        await one.acquire()  # lowered to 1: three holders keep their permits, nobody enters
    for lease in held[:2]:
        await two.release(lease)
    with pytest.raises(LockNotAcquired):
        await one.acquire()
    await one.release(held[2])  # every holder's release still works
    await one.release(await one.acquire())


@pytest.mark.needs("short_ttl")
async def test_a_crashed_holders_permit_and_write_lock_come_back(
    modal_backend: ModalLockBackend,
) -> None:
    semaphore = Semaphore(modal_backend, "pool", permits=1, ttl=0.2, timeout=5)
    rw = ReadWriteLock(modal_backend, "doc", ttl=0.2, timeout=5)
    crashed_permit = await semaphore.acquire()  # never released: its holder "crashed"
    crashed_writer = await rw.write.acquire()
    permit, reader = await semaphore.acquire(), await rw.read.acquire()
    assert permit.fence > crashed_permit.fence
    assert reader.fence > crashed_writer.fence
    # The stale holders cannot renew or release what is now someone else's.
    with pytest.raises(LockNotOwned):
        await semaphore.extend(crashed_permit)
    with pytest.raises(LockNotOwned):
        await rw.write.release(crashed_writer)
    await semaphore.release(permit)
    await rw.read.release(reader)


@pytest.mark.parametrize("how", ["cancelled", "timed out"])
async def test_a_waiter_that_gives_up_leaves_no_place_in_line(
    modal_backend: ModalLockBackend, how: str
) -> None:
    rw = ReadWriteLock(modal_backend, "doc", ttl=10, timeout=30)
    semaphore = Semaphore(modal_backend, "pool", permits=1, ttl=10, timeout=30)
    writer, permit = await rw.write.acquire(), await semaphore.acquire()
    if how == "cancelled":
        waiters = [
            await queued(rw.read, rw.read.acquire),
            await queued(semaphore, semaphore.acquire),
        ]
        for task in waiters:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    else:
        for lock in (rw.read, semaphore):
            with pytest.raises(LockNotAcquired):
                await lock.acquire(timeout=0.05)
    await rw.write.release(writer)
    await semaphore.release(permit)
    # Nobody is left ahead: requests that do not wait are granted at once.
    await rw.write.release(await rw.write.acquire(timeout=0))
    await semaphore.release(await semaphore.acquire(timeout=0))


async def test_hold_works_in_every_mode(modal_backend: ModalLockBackend) -> None:
    rw = ReadWriteLock(modal_backend, "doc", ttl=10, timeout=0)
    semaphore = Semaphore(modal_backend, "doc", permits=1, ttl=10, timeout=0)
    async with rw.write.hold() as lease:
        with pytest.raises(LockNotAcquired):
            await rw.read.acquire()
        # The exclusive lock and the semaphore of the same name are other locks.
        async with semaphore.hold(), Lock(modal_backend, "doc", timeout=0).hold():
            pass
    async with rw.read.hold() as first, rw.read.hold() as second:
        assert first.fence > lease.fence
        assert second.fence > lease.fence


@pytest.mark.parametrize("name", WITHOUT_MODES)
async def test_a_backend_without_modes_is_refused_at_construction(
    name: str, request: pytest.FixtureRequest
) -> None:
    # The real backends the table says lack modes, made as the shared suites make them.
    async with LOCK_BACKENDS[name].make(request) as backend:
        refused = rf"the {name} lock backend does not offer {{}} \(it offers modes: none"
        with pytest.raises(ValueError, match=refused.format("read-write locks")):
            ReadWriteLock(backend, "doc")
        with pytest.raises(ValueError, match=refused.format("semaphores")):
            Semaphore(backend, "pool", permits=2)


@pytest.mark.parametrize(
    ("permits", "error"), [(0, ValueError), (-1, ValueError), (True, TypeError), ("3", TypeError)]
)
def test_bad_permits_are_refused(permits: Any, error: type[Exception]) -> None:
    from headway import MemoryLockBackend

    with pytest.raises(error, match="permits"):
        Semaphore(MemoryLockBackend(), "pool", permits=permits)


@pytest.mark.usefixtures("woken_only")
async def test_a_writer_is_not_starved_by_a_stream_of_readers(
    modal_backend: ModalLockBackend,
) -> None:
    """Readers re-acquire back to back, overlapping, so the lock is never free; a writer
    that queues is granted once the readers ahead of it leave, before any reader behind,
    and its wait is measured: bounded by the holds of the readers ahead of it.

    Counted from the log of one event loop: a read request is "behind" if its acquire
    started after the writer held its place; "in flight" if it started before but was
    not answered yet (it may have reached the queue before or after the writer).
    """
    readers, hold, limit = 4, 0.1, 25
    # For a loaded 2-core machine. A starved writer waits until the readers stop, after
    # ``limit`` rounds behind it each (at least 2.5 s): past the bound of 4 ahead, 1.4 s.
    margin = 1.0
    waited_s = 0.0
    rw = ReadWriteLock(modal_backend, "stream", ttl=10, timeout=30)
    log: list[tuple[str, int, bool]] = []  # (what, reader or -1 for the writer, behind)
    acquiring = [False] * readers
    grants = [0] * readers
    streaming, writer_queued, writer_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    in_flight: set[int] = set()

    async def reader(i: int) -> None:
        await asyncio.sleep(i * hold / readers)  # staggered: the holds overlap
        behind_rounds = 0
        while behind_rounds < limit and not (writer_done.is_set() and behind_rounds):
            behind = writer_queued.is_set()
            acquiring[i] = True
            lease = await rw.read.acquire()
            acquiring[i] = False
            log.append(("grant", i, behind))
            grants[i] += 1
            if min(grants) >= 2:
                streaming.set()
            behind_rounds += behind
            await asyncio.sleep(hold)
            log.append(("release", i, behind))  # before the release: it ends after this
            await rw.read.release(lease)

    async def writer() -> None:
        nonlocal waited_s
        await streaming.wait()
        asked = asyncio.get_running_loop().time()
        task = await queued(rw.write, rw.write.acquire)
        log.append(("queued", -1, False))
        in_flight.update(i for i in range(readers) if acquiring[i])
        writer_queued.set()
        lease = await task
        waited_s = asyncio.get_running_loop().time() - asked
        log.append(("grant", -1, False))
        log.append(("release", -1, False))
        await rw.write.release(lease)
        writer_done.set()

    async with asyncio.timeout(30):
        await asyncio.gather(writer(), *(reader(i) for i in range(readers)))

    queued_at = log.index(("queued", -1, False))
    granted_at = log.index(("grant", -1, False))
    waited = log[queued_at + 1 : granted_at]
    # Its wait was the holds of the readers ahead: inside when it queued, or in flight.
    inside: set[int] = set()
    for what, i, _ in log[:queued_at]:
        (inside.add if what == "grant" else inside.discard)(i)
    ahead = inside | in_flight
    assert waited_s <= len(ahead) * hold + margin, (waited_s, inside, in_flight)
    # Not one read request that came after the writer was granted before it.
    overtook = [e for e in waited if e[0] == "grant" and e[2]]
    assert overtook == [], f"{len(overtook)} later read requests overtook the writer"
    # While it waited, only the readers ahead moved: the ones holding left, the ones in
    # flight (at most one each) were answered; nothing else stood between them and it.
    early = [i for what, i, _ in waited if what == "grant"]
    assert len(early) == len(set(early)), early
    assert set(early) <= in_flight, (early, in_flight)
    # The writer was alone: every read lease granted before it was released before it.
    held: set[int] = set()
    for what, i, _ in log[:granted_at]:
        (held.add if what == "grant" else held.discard)(i)
    assert held == set(), f"readers {held} still held the lock when the writer got it"
    # Every reader behind it came after it, and the stream went on: each reader again.
    after = [n for n, (what, _, behind) in enumerate(log) if what == "grant" and behind]
    assert after[0] > log.index(("release", -1, False))
    assert {log[n][1] for n in after} == set(range(readers))
