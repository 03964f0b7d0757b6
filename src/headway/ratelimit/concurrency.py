"""``ConcurrencyLimiter`` and its sync shell: requests in flight per key, held as leases.

A slot is a lease of the lock primitive: a permit of ``Permits`` (a lock with
``limit`` permits per key), renewed by the lock's watchdog (``Renewal``) and lost
the way a lock is (``LockLost`` cancels the block). The limiters add the
decisions' shape (``Admission``) and the failure modes (``policy.on_error``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

from headway._clock import Clock, MonotonicClock
from headway._errors import BackendUnavailable, ConcurrencyLimitExceeded, LockNotOwned
from headway.lock.lease import Lease
from headway.lock.renewal import Renewal
from headway.ratelimit.arguments import check_seconds
from headway.ratelimit.backends.contract import ConcurrencyBackend, SyncConcurrencyBackend
from headway.ratelimit.backends.memory import MemoryRateLimitBackend, SyncMemoryRateLimitBackend
from headway.ratelimit.permits import Permits, SyncPermits
from headway.ratelimit.policies import Concurrency
from headway.ratelimit.slots import Admission, failed_admission

__all__ = ["ConcurrencyLimiter", "SyncConcurrencyLimiter"]

log = logging.getLogger("headway.ratelimit")


def _check(policy: Concurrency, key: str) -> None:
    if not isinstance(policy, Concurrency):
        raise TypeError(f"not a concurrency policy: {policy!r}")
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")


def _refused(admission: Admission, key: str) -> ConcurrencyLimitExceeded:
    return ConcurrencyLimitExceeded(
        f"{admission.in_flight} of {admission.limit} slots on {key!r} are in use",
        admission=admission,
    )


def _lease(admission: Admission | Lease) -> Lease | None:
    return admission.slot if isinstance(admission, Admission) else admission


def _release_failed(lease: Lease, exc: BackendUnavailable) -> bool:
    log.warning("releasing a slot on %r failed; its lease ends by itself: %s", lease.resource, exc)
    return False


class ConcurrencyLimiter:
    """At most ``policy.limit`` holders of a slot per key at once (async).

    ``acquire`` answers at once (it does not wait for a slot to free up);
    ``hold`` wraps a block: it raises ``ConcurrencyLimitExceeded`` when
    refused, renews the lease while the block runs and releases it at the
    end, whatever the end. A backend that fails or is slower than ``budget``
    gives ``policy.on_error``'s admission. A Redis backend is a
    ``RedisRateLimitBackend`` (the rate limiter's may be shared).

    Args:
        policy: The ``Concurrency`` limit: slots per key, their TTL, the failure mode.
        backend: Where the slots are held; default None: a new ``MemoryRateLimitBackend``, for this
            process only.
        budget: Seconds each backend call may take (finite, >= 0); default 0.25.
        retry_on_error: The ``retry_after`` (seconds) of a failure-mode admission that
            refuses; default 1.0.
        clock: The monotonic clock of deadlines and renewals; default None:
            ``time.monotonic``.

    Raises:
        TypeError: ``policy`` is not a ``Concurrency``, or seconds of the wrong type.
        ValueError: Seconds negative or infinite.
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
        #: The lock with ``policy.limit`` permits per key that holds the slots.
        self.permits = Permits(self.backend, policy, budget=self.budget, clock=self.clock)

    def __repr__(self) -> str:
        return f"ConcurrencyLimiter({self.policy!r}, backend={self.backend.name})"

    async def acquire(self, key: str) -> Admission:
        """Take a slot on ``key`` if one is free; the admission holds it (release it!).

        Answers at once, without waiting for a slot; a backend that fails or is too
        slow gives ``policy.on_error``'s admission.

        Args:
            key: Whose slots: any str.

        Raises:
            TypeError: ``key`` is not a str.
        """
        _check(self.policy, key)
        try:
            return await self.permits.admit(key)
        except BackendUnavailable:
            return failed_admission(self.policy, self.retry_on_error)

    async def release(self, admission: Admission | Lease) -> bool:
        """Give the slot back, even if cancelled meanwhile; never raises for the backend.

        Returns False when there was nothing to release: no slot (refused,
        failed open), a lease that had already ended, or a backend that did
        not answer (the lease then ends by itself).

        Args:
            admission: What ``acquire`` returned, or the slot's ``Lease`` itself.
        """
        lease = _lease(admission)
        if lease is None:
            return False
        try:
            await self.permits.release(lease)
        except LockNotOwned:
            return False
        except BackendUnavailable as exc:
            return _release_failed(lease, exc)
        return True

    async def extend(self, slot: Lease, ttl: float | None = None) -> Lease:
        """Renew ``slot`` for ``ttl`` seconds from now.

        Args:
            slot: The slot's lease (``Admission.slot``).
            ttl: The new lease length in seconds from now; default None: the
                policy's ``ttl``.

        Raises:
            LockNotOwned: The slot's lease had ended.
            BackendUnavailable: The backend did not answer.
        """
        return await self.permits.extend(slot, self.policy.ttl if ttl is None else ttl)

    @contextlib.asynccontextmanager
    async def hold(self, key: str, *, renew: bool = True) -> AsyncIterator[Admission]:
        """Run a block in a slot on ``key``; ``ConcurrencyLimitExceeded`` when none is free.

        The slot is released when the block ends, also by an exception or a
        cancellation. With ``renew`` the slot's lease is held the way
        ``Lock.hold()`` holds a lock's (one ``Renewal``): renewed every third of
        its TTL, so blocks may outlast it, and if a renewal finds the lease
        ended (or the backend was unreachable for a whole TTL) the block is
        cancelled and ``LockLost`` raised, as for any lock. A failure mode that
        admits without a slot runs the block unguarded.

        Args:
            key: Whose slots: any str.
            renew: Renew the slot while the block runs; default True. Without it, a
                block outliving ``policy.ttl`` loses its slot unnoticed.

        Raises:
            ConcurrencyLimitExceeded: No slot was free (or the failure mode refused).
            LockLost: A renewal found the slot gone; the block was cancelled.
            TypeError: ``key`` is not a str.
        """
        admission = await self.acquire(key)
        if not admission.allowed:
            raise _refused(admission, key)
        lease = admission.slot
        if lease is None or not renew:
            try:
                yield admission
            finally:
                await self.release(admission)
            return
        permits = self.permits
        renewal = Renewal(
            lease, permits.extend, ttl=lease.ttl, interval=lease.ttl / 3, clock=self.clock,
            release=permits.release,
        )  # fmt: skip
        async with renewal:
            yield admission


class SyncConcurrencyLimiter:
    """The synchronous ``ConcurrencyLimiter``: the same calls, without renewal.

    ``hold`` releases the slot when its block ends; a block that may outlast
    ``policy.ttl`` should call ``extend``. The latency budget is the backend
    client's socket timeout (``SyncRedisRateLimitBackend.from_url``).

    Args:
        policy: The ``Concurrency`` limit: slots per key, their TTL, the failure mode.
        backend: Where the slots are held; default None: a new
            ``SyncMemoryRateLimitBackend``, for this process only.
        retry_on_error: The ``retry_after`` (seconds) of a failure-mode admission that
            refuses; default 1.0.
        clock: The monotonic clock of deadlines and renewals; default None:
            ``time.monotonic``.

    Raises:
        TypeError: ``policy`` is not a ``Concurrency``, or seconds of the wrong type.
        ValueError: Seconds negative or infinite.
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
        #: The lock with ``policy.limit`` permits per key that holds the slots.
        self.permits = SyncPermits(self.backend, policy, self.clock)

    def __repr__(self) -> str:
        return f"SyncConcurrencyLimiter({self.policy!r}, backend={self.backend.name})"

    def acquire(self, key: str) -> Admission:
        """Take a slot on ``key`` if one is free; the admission holds it (release it!).

        Answers at once, without waiting for a slot; a backend that fails gives
        ``policy.on_error``'s admission.

        Args:
            key: Whose slots: any str.

        Raises:
            TypeError: ``key`` is not a str.
        """
        _check(self.policy, key)
        try:
            return self.permits.admit(key)
        except BackendUnavailable:
            # A slot granted unseen ends with its lease: another call now would wait out
            # the outage a second time.
            return failed_admission(self.policy, self.retry_on_error)

    def release(self, admission: Admission | Lease) -> bool:
        """Give the slot back; never raises for the backend.

        Returns False when there was nothing to release: no slot (refused,
        failed open), a lease that had already ended, or a backend that did
        not answer (the lease then ends by itself).

        Args:
            admission: What ``acquire`` returned, or the slot's ``Lease`` itself.
        """
        lease = _lease(admission)
        if lease is None:
            return False
        try:
            self.permits.release(lease)
        except LockNotOwned:
            return False
        except BackendUnavailable as exc:
            return _release_failed(lease, exc)
        return True

    def extend(self, slot: Lease, ttl: float | None = None) -> Lease:
        """Renew ``slot`` for ``ttl`` seconds from now.

        Args:
            slot: The slot's lease (``Admission.slot``).
            ttl: The new lease length in seconds from now; default None: the
                policy's ``ttl``.

        Raises:
            LockNotOwned: The slot's lease had ended.
            BackendUnavailable: The backend did not answer.
        """
        return self.permits.extend(slot, self.policy.ttl if ttl is None else ttl)

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[Admission]:
        """Run a block in a slot on ``key``, released when the block ends; no renewal.

        Args:
            key: Whose slots: any str.

        Raises:
            ConcurrencyLimitExceeded: No slot was free (or the failure mode refused).
            TypeError: ``key`` is not a str.
        """
        admission = self.acquire(key)
        if not admission.allowed:
            raise _refused(admission, key)
        try:
            yield admission
        finally:
            self.release(admission)
