"""``hold()`` in every mode (``rw.read``, ``rw.write``, ``Semaphore``), async and sync, over
every entry of the shared tables that offers ``modes`` (conftest): renewal keeps a lease
past its TTL while contenders are refused, and a lease taken away under ``hold()`` ends
the block with ``LockLost`` (taken as ``test_lock_hold.py`` takes the exclusive lock's:
released behind the holder's back, then granted to a thief)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from headway import Lease, LockLost, LockNotAcquired, LockNotOwned, SyncLock
from headway.lock.contract import ModalLockBackend, SyncModalLockBackend
from headway.lock.shared import ReadWriteLock, Semaphore, SyncReadWriteLock, SyncSemaphore

pytestmark = pytest.mark.anyio

MODES = ["read", "write", "permits"]
#: Short enough that a lease not renewed lapses within the test, long enough that a
#: renewal every RENEW_EVERY survives a stall on a loaded 2-core machine.
TTL, RENEW_EVERY = 0.5, 0.05
HELD_FOR = 2.5 * TTL  # only renewals keep a lease this long


def locks(backend: Any, make_rw: Any, make_semaphore: Any, ttl: float) -> dict[str, Any]:
    """mode -> (its lock, a contender its holder refuses), on names of their own."""
    rw = make_rw(backend, "doc", ttl=ttl, timeout=0)
    other = make_rw(backend, "other", ttl=ttl, timeout=0)
    semaphore = make_semaphore(backend, "pool", permits=1, ttl=ttl, timeout=0)
    return {"read": (rw.read, rw.write), "write": (other.write, other.read),
            "permits": (semaphore, semaphore)}  # fmt: skip


@pytest.mark.needs("short_ttl")
async def test_hold_renews_every_mode_past_its_ttl(modal_backend: ModalLockBackend) -> None:
    held = locks(modal_backend, ReadWriteLock, Semaphore, TTL)
    loop = asyncio.get_running_loop()
    refused = attempts = 0
    read, write, permit = (held[mode][0].hold(renew_every=RENEW_EVERY) for mode in MODES)
    async with read, write, permit:
        end = loop.time() + HELD_FOR
        while loop.time() < end:
            for _, contender in held.values():
                attempts += 1
                with pytest.raises(LockNotAcquired):
                    await contender.acquire()
                refused += 1
            await asyncio.sleep(TTL / 10)  # paced: asked all along the 2.5 TTLs
    assert refused == attempts >= 3 * 10
    for _, contender in held.values():  # released on the way out
        await contender.release(await contender.acquire())


@pytest.mark.parametrize("mode", MODES)
async def test_a_lost_lease_cancels_the_hold_with_lock_lost(
    modal_backend: ModalLockBackend, mode: str
) -> None:
    lock, thief_lock = locks(modal_backend, ReadWriteLock, Semaphore, 0.6)[mode]
    reached_end = False
    thief: Lease | None = None
    with pytest.raises(LockLost) as caught:
        async with asyncio.timeout(5):
            async with lock.hold(renew_every=0.1) as lease:
                # Someone else takes over (as after an expiry): the lease is gone.
                await lock.backend.release(lease)
                thief = await thief_lock.acquire(ttl=5)
                await asyncio.Event().wait()
                reached_end = True
    assert not reached_end
    assert caught.value.resource == lock.resource
    assert thief is not None
    await thief_lock.release(thief)  # the thief's lease was not touched by the loser


@pytest.mark.needs("short_ttl")
def test_sync_hold_renews_every_mode_past_its_ttl(
    sync_modal_backend: SyncModalLockBackend,
) -> None:
    held = locks(sync_modal_backend, SyncReadWriteLock, SyncSemaphore, TTL)
    refused = attempts = 0
    read, write, permit = (held[mode][0].hold(renew_every=RENEW_EVERY) for mode in MODES)
    with read, write, permit:
        end = time.monotonic() + HELD_FOR
        while time.monotonic() < end:
            for _, contender in held.values():
                attempts += 1
                with pytest.raises(LockNotAcquired):
                    contender.acquire()
                refused += 1
            time.sleep(TTL / 10)  # paced: asked all along the 2.5 TTLs
    assert refused == attempts >= 3 * 10
    for _, contender in held.values():
        contender.release(contender.acquire())


@pytest.mark.parametrize("mode", MODES)
def test_sync_hold_reports_a_lost_lease_in_every_mode(
    sync_modal_backend: SyncModalLockBackend, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock, thief_lock = locks(sync_modal_backend, SyncReadWriteLock, SyncSemaphore, 5.0)[mode]
    refused_renewal = _watch_renewals(lock, monkeypatch)
    thief = None
    with pytest.raises(LockLost) as caught, lock.hold(renew_every=0.1) as lease:
        # Someone else takes over (as after an expiry): the next renewal is refused.
        lock.backend.release(lease)
        thief = thief_lock.acquire()
        assert refused_renewal.wait(10)  # the block ends once the holder knows
    assert caught.value.resource == lock.resource
    assert thief is not None
    thief_lock.release(thief)  # the thief's lease was not touched by the loser


def _watch_renewals(lock: SyncLock, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set when one of ``lock``'s renewals is refused (``LockNotOwned``)."""
    refused = threading.Event()
    extend = lock.extend

    def watched(lease: Lease, ttl: float | None = None) -> Lease:
        try:
            return extend(lease, ttl)
        except LockNotOwned:
            refused.set()
            raise

    monkeypatch.setattr(lock, "extend", watched)
    return refused
