"""Permits: a lock with ``policy.limit`` holders per key, over a backend's concurrency slots.

``Permits`` and ``SyncPermits`` keep the lock backend contract (``LockBackend``,
``SyncLockBackend``): ``acquire`` returns a ``Lease`` or raises
``LockNotAcquired``; ``release`` and ``extend`` raise ``LockNotOwned`` once the
lease ended. So a slot is held by ``Lock.hold()`` (its watchdog, its
``LockLost``) like any lock. The built-in backends keep the slots as a
``Semaphore``'s permits (the lock family's model in memory, its scripts on Redis):
an acquire is the semaphore's answer-at-once mode, which never queues, and a
release or a renewal is the semaphore's own. ``admit`` is the acquire answering
with the ``Admission`` (slots in flight, the wait when refused). A permit's lease
has the fencing token ``PERMIT_FENCE`` (0): see ``slots``.

The async shell bounds each call by ``budget`` and makes acquire and release
safe under cancellation (``run_to_end``); an acquire whose reply was lost
(budget, outage) is undone in the background. What a crash leaves behind ends
with the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from headway._clock import Clock
from headway._errors import BackendUnavailable, LockNotAcquired, LockNotOwned
from headway.lock.driver import run_to_end
from headway.lock.lease import Lease, check_timeout, check_ttl, new_token
from headway.ratelimit.backends.contract import ConcurrencyBackend, SyncConcurrencyBackend
from headway.ratelimit.policies import Concurrency
from headway.ratelimit.slots import Admission, Grant, admitted

__all__ = ["Permits", "SyncPermits"]

T = TypeVar("T")


def _check_acquire(policy: Concurrency, resource: str, ttl: float, timeout: float) -> None:
    if check_timeout(timeout) != 0 or check_ttl(ttl) != policy.ttl_ms:
        raise ValueError(
            f"permits on {resource!r} are taken at once (timeout=0) for the policy's "
            f"ttl ({policy.ttl:g} s), got timeout={timeout!r}, ttl={ttl!r}"
        )


def _all_held(admission: Admission, resource: str) -> LockNotAcquired:
    return LockNotAcquired(
        f"{admission.in_flight} of {admission.limit} permits on {resource!r} are held",
        resource=resource,
    )


def _not_owned(lease: Lease, what: str) -> LockNotOwned:
    return LockNotOwned(
        f"cannot {what} the slot on {lease.resource!r}: its lease is no longer held",
        resource=lease.resource,
    )


class Permits:
    """An async lock with ``policy.limit`` permits per resource (``LockBackend``)."""

    def __init__(
        self, backend: ConcurrencyBackend, policy: Concurrency, *, budget: float, clock: Clock
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.budget = budget
        self.clock = clock
        self.name = backend.name
        self._undoing: set[asyncio.Task[object]] = set()

    async def _timed(self, aw: Awaitable[T]) -> T:
        async with asyncio.timeout(self.budget):
            return await aw

    def _over_budget(self, what: str) -> BackendUnavailable:
        return BackendUnavailable(f"{what} took more than {self.budget:g} s", backend=self.name)

    def _undo_later(self, key: str, token: str) -> None:
        """Release ``token`` in the background: its acquire may have succeeded unseen."""

        async def undo() -> None:
            with contextlib.suppress(BackendUnavailable, TimeoutError):
                await self._timed(self.backend.release_slot(key, self.policy, token))

        task: asyncio.Task[object] = asyncio.get_running_loop().create_task(undo())
        self._undoing.add(task)
        task.add_done_callback(self._undoing.discard)

    async def admit(self, key: str) -> Admission:
        """Take a permit on ``key`` if one is free: one backend call, never waiting.

        ``BackendUnavailable`` when the backend failed or took more than ``budget``.
        """
        token, sent = new_token(), self.clock()

        async def undo(grant: Grant) -> None:
            if grant.granted:
                await self._timed(self.backend.release_slot(key, self.policy, token))

        try:
            call = self._timed(self.backend.acquire_slot(key, self.policy, token))
            grant = await run_to_end(call, undo)
        except (BackendUnavailable, TimeoutError) as exc:
            self._undo_later(key, token)
            if isinstance(exc, TimeoutError):
                raise self._over_budget("taking a slot") from exc
            raise
        except asyncio.CancelledError:
            # run_to_end() undid any grant it saw; one lost with a failed reply is undone here.
            self._undo_later(key, token)
            raise
        return admitted(grant, key, self.policy, token, sent)

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """A permit's lease on ``resource``, or ``LockNotAcquired`` when all are held.

        ``timeout`` must be 0 and ``ttl`` the policy's: permits are not queued.
        """
        _check_acquire(self.policy, resource, ttl, timeout)
        admission = await self.admit(resource)
        if admission.slot is None:
            raise _all_held(admission, resource)
        return admission.slot

    async def release(self, lease: Lease) -> None:
        """Give the permit back, even if cancelled meanwhile; ``LockNotOwned`` if it lapsed."""
        call = self._timed(self.backend.release_slot(lease.resource, self.policy, lease.token))
        try:
            held = await run_to_end(call)
        except TimeoutError as exc:
            raise self._over_budget("releasing a slot") from exc
        if not held:
            raise _not_owned(lease, "release")

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        """Renew the lease for ``ttl`` s from now; ``LockNotOwned`` if it lapsed."""
        ttl_ms = check_ttl(ttl)
        sent = self.clock()
        call = self.backend.extend_slot(lease.resource, self.policy, lease.token, ttl_ms)
        try:
            held = await self._timed(call)
        except TimeoutError as exc:
            raise self._over_budget("renewing a slot") from exc
        if not held:
            raise _not_owned(lease, "extend")
        return lease.renewed(ttl_ms, sent)


class SyncPermits:
    """The synchronous ``Permits`` (``SyncLockBackend``); the budget is the client's timeout."""

    def __init__(self, backend: SyncConcurrencyBackend, policy: Concurrency, clock: Clock) -> None:
        self.backend = backend
        self.policy = policy
        self.clock = clock
        self.name = backend.name

    def admit(self, key: str) -> Admission:
        """Take a permit on ``key`` if one is free (see ``Permits.admit``)."""
        token, sent = new_token(), self.clock()
        grant = self.backend.acquire_slot(key, self.policy, token)
        return admitted(grant, key, self.policy, token, sent)

    def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """A permit's lease on ``resource`` (see ``Permits.acquire``)."""
        _check_acquire(self.policy, resource, ttl, timeout)
        admission = self.admit(resource)
        if admission.slot is None:
            raise _all_held(admission, resource)
        return admission.slot

    def release(self, lease: Lease) -> None:
        """Give the permit back; ``LockNotOwned`` if it lapsed."""
        if not self.backend.release_slot(lease.resource, self.policy, lease.token):
            raise _not_owned(lease, "release")

    def extend(self, lease: Lease, ttl: float) -> Lease:
        """Renew the lease for ``ttl`` s from now; ``LockNotOwned`` if it lapsed."""
        ttl_ms = check_ttl(ttl)
        sent = self.clock()
        if not self.backend.extend_slot(lease.resource, self.policy, lease.token, ttl_ms):
            raise _not_owned(lease, "extend")
        return lease.renewed(ttl_ms, sent)
