"""``Election`` over every async backend (``lock_backend``): campaign, terms, resign, loss;
``leader()`` and ``observe()`` over those that can tell who holds a lock (``inspect``)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket

import pytest

from headway import (
    Election,
    Leader,
    Leadership,
    Lease,
    LockBackend,
    LockLost,
    LockNotAcquired,
    MemoryLockBackend,
)
from headway.lock.election import default_identity
from headway.lock.introspection import check_owner
from tests.lock.conftest import LOCK_BACKENDS
from tests.lock.toy_backend import ToyLockBackend

pytestmark = pytest.mark.anyio


async def test_one_leader_and_the_term_rises_with_each(lock_backend: LockBackend) -> None:
    a = Election(lock_backend, "jobs", identity="a", ttl=5)
    b = Election(lock_backend, "jobs", identity="b", ttl=5)
    elected = asyncio.Event()
    terms: list[int] = []

    async def campaign_b() -> None:
        async with b.campaign() as term:  # waits as long as it takes
            terms.append(term.term)
            elected.set()

    async with a.campaign() as first:
        assert (first.identity, first.lease.fence) == ("a", first.term)
        with pytest.raises(LockNotAcquired):
            async with b.campaign(timeout=0):
                pytest.fail("two leaders")
        waiting = asyncio.create_task(campaign_b())
        await asyncio.sleep(0.05)  # b is waiting, not leading
        assert not elected.is_set()
    async with asyncio.timeout(5):
        await waiting  # a left the block: b is elected at once
    async with a.campaign(timeout=5) as third:
        pass
    assert first.term < terms[0] < third.term


async def test_resign_ends_the_block_quietly_and_elects_the_next(
    lock_backend: LockBackend,
) -> None:
    a = Election(lock_backend, "jobs", identity="a", ttl=5)
    b = Election(lock_backend, "jobs", identity="b", ttl=5)
    reached_end = False
    async with asyncio.timeout(5):
        async with a.campaign() as term:
            term.resign()
            await asyncio.Event().wait()  # cancelled here, at the next await
            reached_end = True
    assert not reached_end
    assert term.resigned
    async with b.campaign(timeout=0) as successor:  # the lease was released
        assert successor.term > term.term


async def test_another_task_can_make_the_leader_resign(lock_backend: LockBackend) -> None:
    election = Election(lock_backend, "jobs", ttl=5)
    held: list[Leadership] = []
    leading = asyncio.Event()
    after: list[str] = []

    async def leader() -> None:
        async with election.campaign() as term:
            held.append(term)
            leading.set()
            await asyncio.Event().wait()
        after.append(f"term {term.term} over")

    task = asyncio.create_task(leader())
    async with asyncio.timeout(5):
        await leading.wait()
        [leadership] = held
        leadership.resign()  # a shutdown handler, say
        leadership.resign()  # twice: nothing more
        await task
    assert after == [f"term {leadership.term} over"]
    async with election.campaign(timeout=0):
        pass


async def test_a_lost_lease_cancels_the_leader(lock_backend: LockBackend) -> None:
    election = Election(lock_backend, "jobs", ttl=5, renew_every=0.05)
    reached_end = False
    with pytest.raises(LockLost) as caught:
        async with asyncio.timeout(5):
            async with election.campaign() as term:
                # Its lease is gone (as after a pause past the TTL): the next renewal
                # is refused and the block is cancelled.
                await lock_backend.release(term.lease)
                await asyncio.Event().wait()
                reached_end = True
    assert not reached_end
    assert caught.value.resource == "jobs"
    async with election.campaign(timeout=0) as successor:
        assert successor.term > term.term


class HandsOverLate(MemoryLockBackend):
    """Grants leases whose deadline counts from an attempt a TTL ago, as a lease handed
    over by another waiter does (Redis: the waiter's last refused attempt)."""

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        lease = await super().acquire(resource, ttl, timeout)
        return dataclasses.replace(lease, deadline=lease.deadline - ttl)


async def test_a_stale_handed_over_lease_is_renewed_before_leading() -> None:
    election = Election(HandsOverLate(), "jobs", ttl=5)
    async with asyncio.timeout(5), election.campaign() as term:
        assert term.lease.remaining() > 4  # renewed: the block is not cancelled at once
        await asyncio.sleep(0.05)
    assert not term.resigned


async def test_an_error_in_the_block_resigns_and_propagates(lock_backend: LockBackend) -> None:
    election = Election(lock_backend, "jobs", ttl=5)
    with pytest.raises(KeyError):
        async with election.campaign():
            raise KeyError("boom")
    async with election.campaign(timeout=0):
        pass


@pytest.mark.needs("inspect")
async def test_leader_names_the_leader_and_its_term(lock_backend: LockBackend) -> None:
    election = Election(lock_backend, "jobs", identity="worker-7:pid-3", ttl=5)
    bystander = Election(lock_backend, "jobs", identity="bystander")
    assert await bystander.leader() is None
    async with election.campaign() as term:
        leader = await bystander.leader()
        assert leader is not None
        assert (leader.identity, leader.term) == (named(lock_backend, "worker-7:pid-3"), term.term)
        assert leader.expires_in is None or 0 < leader.expires_in <= 5
    assert await bystander.leader() is None


@pytest.mark.needs("inspect")
async def test_observe_reports_each_change_once(lock_backend: LockBackend) -> None:
    a = Election(lock_backend, "jobs", identity="a", ttl=5)
    b = Election(lock_backend, "jobs", identity="b", ttl=5)
    seen: asyncio.Queue[Leader | None] = asyncio.Queue()

    async def watch() -> None:
        async for leader in Election(lock_backend, "jobs").observe(interval=0.01):
            await seen.put(leader)

    watcher = asyncio.create_task(watch())
    try:
        async with asyncio.timeout(5):
            assert await seen.get() is None  # the state now, first
            async with a.campaign() as term_a:
                assert _who(await seen.get()) == (named(lock_backend, "a"), term_a.term)
                await asyncio.sleep(0.1)  # ten readings: no change, nothing reported
                assert seen.empty()
            # a resigned; b may be elected before a reading sees nobody in between
            async with b.campaign() as term_b:
                changes = [_who(await seen.get())]
                if changes == [None]:
                    changes.append(_who(await seen.get()))
                assert changes[-1] == (named(lock_backend, "b"), term_b.term)
            assert await seen.get() is None
    finally:
        watcher.cancel()


#: Backends whose store keeps no owner (conftest's "owner" capability): a leader has no
#: identity there.
KEEP_NO_OWNER = {name for name, entry in LOCK_BACKENDS.items() if "owner" in entry.lacks}


def named(backend: LockBackend, identity: str) -> str | None:
    """The identity ``leader()`` shows on ``backend`` for a candidate named ``identity``."""
    return None if backend.name in KEEP_NO_OWNER else identity


def _who(leader: Leader | None) -> tuple[str | None, int] | None:
    return None if leader is None else (leader.identity, leader.term)


async def test_a_backend_that_cannot_tell_who_leads_says_so() -> None:
    election = Election(ToyLockBackend(), "jobs")
    with pytest.raises(TypeError, match="cannot tell who holds"):
        await election.leader()
    with pytest.raises(TypeError, match="cannot tell who holds"):
        await anext(election.observe())


def test_the_default_identity_is_host_and_pid_as_an_owner_label(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert check_owner(default_identity()) == default_identity()
    assert default_identity().endswith(f":{__import__('os').getpid()}")
    monkeypatch.setattr(socket, "gethostname", lambda: "my host\té" + "x" * 80)
    odd = default_identity()
    assert check_owner(odd) == odd
    assert odd.startswith("my-host--")
    assert len(odd) == 64
    assert Election(MemoryLockBackend(), "jobs").identity == odd


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": ""}, ValueError),
        ({"name": 3}, TypeError),
        ({"identity": "two words"}, ValueError),
        ({"identity": "x" * 65}, ValueError),
        ({"ttl": 0}, ValueError),
        ({"ttl": 5, "renew_every": 5}, ValueError),
    ],
)
def test_bad_elections_are_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    args: dict[str, object] = {"name": "jobs", **kwargs}
    with pytest.raises(error):
        Election(MemoryLockBackend(), **args)  # type: ignore[arg-type]


async def test_bad_timeouts_and_intervals_are_refused() -> None:
    election = Election(MemoryLockBackend(), "jobs")
    with pytest.raises(ValueError, match="timeout"):
        election.campaign(timeout=-1)
    for interval in (0, float("inf")):
        with pytest.raises(ValueError, match="interval"):
            election.observe(interval=interval)
