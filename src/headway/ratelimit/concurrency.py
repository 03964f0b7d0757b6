"""``ConcurrencyLimiter`` and its sync shell: requests in flight per key, held as leases.

Both shells build admissions with the same pure helpers (``_slots``). The
async one takes care that a slot is never stranded by its caller: acquire
and release run to the end even when the caller is cancelled (``complete``),
and an acquire whose reply was lost (budget, outage) is undone in the
background. What a crash leaves behind ends with the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import TypeVar

from headway._clock import Clock, MonotonicClock
from headway._errors import BackendUnavailable, ConcurrencyLimitExceeded, LockNotOwned
from headway.lock.backend import complete
from headway.lock.lease import check_ttl, new_token
from headway.ratelimit.arguments import check_seconds
from headway.ratelimit.backends.contract import ConcurrencyBackend, SyncConcurrencyBackend
from headway.ratelimit.backends.memory import MemoryRateLimitBackend, SyncMemoryRateLimitBackend
from headway.ratelimit.policies import Concurrency
from headway.ratelimit.slots import Admission, Grant, Slot, admitted, failed_admission

__all__ = ["ConcurrencyLimiter", "SyncConcurrencyLimiter"]

log = logging.getLogger("headway.ratelimit")
T = TypeVar("T")


def _check(policy: Concurrency, key: str) -> None:
    if not isinstance(policy, Concurrency):
        raise TypeError(f"not a concurrency policy: {policy!r}")
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")


def _not_owned(slot: Slot) -> LockNotOwned:
    return LockNotOwned(
        f"the concurrency slot on {slot.key!r} is no longer held (its lease ended)",
        resource=slot.key,
    )


def _refused(admission: Admission, key: str) -> ConcurrencyLimitExceeded:
    return ConcurrencyLimitExceeded(
        f"{admission.in_flight} of {admission.limit} slots on {key!r} are in use",
        admission=admission,
    )


class ConcurrencyLimiter:
    """At most ``policy.limit`` holders of a slot per key at once (async).

    ``acquire`` answers at once (it does not wait for a slot to free up);
    ``hold`` wraps a block: it raises ``ConcurrencyLimitExceeded`` when
    refused, renews the lease while the block runs and releases it at the
    end, whatever the end. ``budget`` bounds each backend call in seconds; a
    backend that fails or is slower gives ``policy.on_error``'s admission.
    With no backend, an in-memory one serves this process; a Redis backend
    is a ``RedisRateLimitBackend`` (the rate limiter's may be shared).
    """

    def __init__(
        self,
        policy: Concurrency,
        *,
        backend: ConcurrencyBackend | None = None,
        budget: float = 0.25,
        retry_on_error: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        _check(policy, "")
        self.policy = policy
        self.backend: ConcurrencyBackend = backend or MemoryRateLimitBackend()
        self.budget = check_seconds("budget", budget)
        self.retry_on_error = check_seconds("retry_on_error", retry_on_error)
        self.clock: Clock = clock or MonotonicClock()
        self._undoing: set[asyncio.Task[object]] = set()

    def __repr__(self) -> str:
        return f"ConcurrencyLimiter({self.policy!r}, backend={self.backend.name})"

    async def _timed(self, aw: Awaitable[T]) -> T:
        async with asyncio.timeout(self.budget):
            return await aw

    def _undo_later(self, key: str, token: str) -> None:
        """Release ``token`` in the background: its acquire may have succeeded unseen."""

        async def undo() -> None:
            with contextlib.suppress(BackendUnavailable, TimeoutError):
                await self._timed(self.backend.release_slot(key, self.policy, token))

        task: asyncio.Task[object] = asyncio.get_running_loop().create_task(undo())
        self._undoing.add(task)
        task.add_done_callback(self._undoing.discard)

    async def acquire(self, key: str) -> Admission:
        """Take a slot on ``key`` if one is free; the admission holds it (release it!)."""
        _check(self.policy, key)
        token, sent = new_token(), self.clock()

        async def undo(grant: Grant) -> None:
            if grant.granted:
                await self._timed(self.backend.release_slot(key, self.policy, token))

        try:
            call = self._timed(self.backend.acquire_slot(key, self.policy, token))
            grant = await complete(call, undo)
        except (BackendUnavailable, TimeoutError):
            self._undo_later(key, token)
            return failed_admission(self.policy, self.retry_on_error)
        except asyncio.CancelledError:
            # complete() undid any grant it saw; one lost with a failed reply is undone here.
            self._undo_later(key, token)
            raise
        return admitted(grant, key, self.policy, token, sent)

    async def release(self, admission: Admission | Slot) -> bool:
        """Give the slot back, even if cancelled meanwhile; never raises for the backend.

        Returns False when there was nothing to release: no slot (refused,
        failed open), a lease that had already ended, or a backend that did
        not answer (the lease then ends by itself).
        """
        slot = admission.slot if isinstance(admission, Admission) else admission
        if slot is None:
            return False
        call = self._timed(self.backend.release_slot(slot.key, slot.policy, slot.token))
        try:
            return await complete(call)
        except (BackendUnavailable, TimeoutError) as exc:
            log.warning(
                "releasing a slot on %r failed; its lease ends by itself: %s", slot.key, exc
            )
            return False

    async def extend(self, slot: Slot, ttl: float | None = None) -> Slot:
        """Renew ``slot`` for ``ttl`` s from now (default: the policy's); ``LockNotOwned`` if
        its lease had ended, ``BackendUnavailable`` if the backend did not answer."""
        ttl_ms = check_ttl(slot.policy.ttl if ttl is None else ttl)
        sent = self.clock()
        try:
            held = await self._timed(
                self.backend.extend_slot(slot.key, slot.policy, slot.token, ttl_ms)
            )
        except TimeoutError as exc:
            raise BackendUnavailable(
                f"renewing a slot took more than {self.budget:g} s", backend=self.backend.name
            ) from exc
        if not held:
            raise _not_owned(slot)
        return slot.renewed(ttl_ms, sent)

    @contextlib.asynccontextmanager
    async def hold(self, key: str, *, renew: bool = True) -> AsyncIterator[Admission]:
        """Run a block in a slot on ``key``; ``ConcurrencyLimitExceeded`` when none is free.

        The slot is released when the block ends, also by an exception or a
        cancellation. With ``renew`` the lease is renewed every third of its
        TTL, so blocks may outlast it; if a renewal finds the lease ended
        (the backend was unreachable for a whole TTL), the block goes on and
        a warning is logged: a concurrency limit protects capacity, it is not
        a lock worth cancelling work for.
        """
        admission = await self.acquire(key)
        if not admission.allowed:
            raise _refused(admission, key)
        if admission.slot is None:  # failed open: run without a slot
            yield admission
            return
        held = [admission.slot]
        renewer = asyncio.get_running_loop().create_task(self._renew(held)) if renew else None
        try:
            yield admission
        finally:
            # Not awaited: a second cancellation must not skip the release. A renewal
            # still in flight cannot bring the slot back (it only renews a held lease).
            if renewer is not None:
                renewer.cancel()
            await self.release(held[0])

    async def _renew(self, held: list[Slot]) -> None:
        slot = held[0]
        interval = slot.ttl / 3
        while True:
            await asyncio.sleep(interval)
            try:
                slot = held[0] = await self.extend(slot)
                interval = slot.ttl / 3
            except LockNotOwned:
                log.warning("the slot on %r ended before it was renewed", slot.key)
                return
            except BackendUnavailable as exc:
                if slot.remaining(self.clock()) <= 0:
                    log.warning("the slot on %r ended: %s", slot.key, exc)
                    return
                interval = min(slot.ttl / 3, 0.1)


class SyncConcurrencyLimiter:
    """The synchronous ``ConcurrencyLimiter``: the same calls, without renewal.

    ``hold`` releases the slot when its block ends; a block that may outlast
    ``policy.ttl`` should call ``extend``. The latency budget is the backend
    client's socket timeout (``SyncRedisRateLimitBackend.from_url``).
    """

    def __init__(
        self,
        policy: Concurrency,
        *,
        backend: SyncConcurrencyBackend | None = None,
        retry_on_error: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        _check(policy, "")
        self.policy = policy
        self.backend: SyncConcurrencyBackend = backend or SyncMemoryRateLimitBackend()
        self.retry_on_error = check_seconds("retry_on_error", retry_on_error)
        self.clock: Clock = clock or MonotonicClock()

    def __repr__(self) -> str:
        return f"SyncConcurrencyLimiter({self.policy!r}, backend={self.backend.name})"

    def acquire(self, key: str) -> Admission:
        """Take a slot on ``key`` if one is free (see ``ConcurrencyLimiter.acquire``)."""
        _check(self.policy, key)
        token, sent = new_token(), self.clock()
        try:
            grant = self.backend.acquire_slot(key, self.policy, token)
        except BackendUnavailable:
            # A slot granted unseen ends with its lease: another call now would wait out
            # the outage a second time.
            return failed_admission(self.policy, self.retry_on_error)
        return admitted(grant, key, self.policy, token, sent)

    def release(self, admission: Admission | Slot) -> bool:
        """Give the slot back (see ``ConcurrencyLimiter.release``)."""
        slot = admission.slot if isinstance(admission, Admission) else admission
        if slot is None:
            return False
        try:
            return self.backend.release_slot(slot.key, slot.policy, slot.token)
        except BackendUnavailable as exc:
            log.warning(
                "releasing a slot on %r failed; its lease ends by itself: %s", slot.key, exc
            )
            return False

    def extend(self, slot: Slot, ttl: float | None = None) -> Slot:
        """Renew ``slot`` (see ``ConcurrencyLimiter.extend``)."""
        ttl_ms = check_ttl(slot.policy.ttl if ttl is None else ttl)
        sent = self.clock()
        if not self.backend.extend_slot(slot.key, slot.policy, slot.token, ttl_ms):
            raise _not_owned(slot)
        return slot.renewed(ttl_ms, sent)

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[Admission]:
        """Run a block in a slot on ``key`` (see ``ConcurrencyLimiter.hold``), without renewal."""
        admission = self.acquire(key)
        if not admission.allowed:
            raise _refused(admission, key)
        try:
            yield admission
        finally:
            self.release(admission)
