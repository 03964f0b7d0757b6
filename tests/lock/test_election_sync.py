"""``SyncElection`` over every sync backend (``sync_lock_backend``): campaign, terms,
resign, a lost lease reported when the block ends; ``leader()`` and ``observe()``."""

from __future__ import annotations

import threading

import pytest

from headway import (
    LockLost,
    LockNotAcquired,
    SyncElection,
    SyncLeadership,
    SyncLockBackend,
)
from tests.lock.conftest import SYNC_LOCK_BACKENDS


def leads(leadership: SyncLeadership) -> bool:
    return leadership.leading  # read through a call: mypy would narrow the property


def test_one_leader_and_the_term_rises_with_each(sync_lock_backend: SyncLockBackend) -> None:
    a = SyncElection(sync_lock_backend, "jobs", identity="a", ttl=5)
    b = SyncElection(sync_lock_backend, "jobs", identity="b", ttl=5)
    with a.campaign() as first:
        assert leads(first)
        assert (first.identity, first.lease.fence) == ("a", first.term)
        with pytest.raises(LockNotAcquired), b.campaign(timeout=0):
            pass  # never runs: two leaders
    assert not leads(first)
    with b.campaign(timeout=0) as second:
        pass
    assert first.term < second.term


def test_resign_releases_at_once(sync_lock_backend: SyncLockBackend) -> None:
    a = SyncElection(sync_lock_backend, "jobs", identity="a", ttl=5)
    b = SyncElection(sync_lock_backend, "jobs", identity="b", ttl=5)
    with a.campaign() as term:
        term.resign()
        assert not term.leading
        # Released now, while a's block still runs: b is elected without waiting.
        with b.campaign(timeout=0) as successor:
            assert successor.term > term.term
        term.resign()  # again: nothing more


def test_a_lost_lease_is_seen_and_raised_when_the_block_ends(
    sync_lock_backend: SyncLockBackend,
) -> None:
    election = SyncElection(sync_lock_backend, "jobs", ttl=5, renew_every=0.05)
    with pytest.raises(LockLost) as caught, election.campaign() as term:
        sync_lock_backend.release(term.lease)  # gone, as after a pause past the TTL
        lost = threading.Event()
        while term.leading:  # the renewal thread finds out
            lost.wait(0.01)
    assert caught.value.resource == "jobs"
    with election.campaign(timeout=0) as successor:
        assert successor.term > term.term


def test_an_error_in_the_block_resigns_and_propagates(
    sync_lock_backend: SyncLockBackend,
) -> None:
    election = SyncElection(sync_lock_backend, "jobs", ttl=5)
    with pytest.raises(KeyError), election.campaign():
        raise KeyError("boom")
    with election.campaign(timeout=0):
        pass


#: The sync backends whose leaders have no identity (no owner label kept).
KEEP_NO_OWNER = {name for name, entry in SYNC_LOCK_BACKENDS.items() if "owner" in entry.lacks}


@pytest.mark.needs("inspect")
def test_leader_and_observe(sync_lock_backend: SyncLockBackend) -> None:
    a = SyncElection(sync_lock_backend, "jobs", identity="a", ttl=5)
    watcher = SyncElection(sync_lock_backend, "jobs")
    identity = None if sync_lock_backend.name in KEEP_NO_OWNER else "a"
    changes = watcher.observe(interval=0.01)
    assert watcher.leader() is None
    assert next(changes) is None
    with a.campaign() as term:
        leader = watcher.leader()
        assert leader is not None
        assert (leader.identity, leader.term) == (identity, term.term)
        assert leader.expires_in is None or 0 < leader.expires_in <= 5
        seen = next(changes)  # the next reading that differs
        assert seen is not None
        assert (seen.identity, seen.term) == (identity, term.term)
    assert next(changes) is None
    with pytest.raises(ValueError, match="interval"):
        watcher.observe(interval=0)
    with pytest.raises(ValueError, match="timeout"), watcher.campaign(timeout=-1):
        pass
