"""``SyncLock``: the synchronous ``Lock``, over a sync backend, and its ``hold()``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from headway._errors import BackendUnavailable, LockLost, LockNotOwned
from headway.lock.contract import SyncLockBackend
from headway.lock.introspection import LockState, check_owner, owned_by
from headway.lock.lease import Lease, check_timeout, check_ttl
from headway.lock.lock import _check_hold, inspector
from headway.lock.renewal import SyncRenewal, fresh_sync

__all__ = ["SyncLock"]


class SyncLock:
    """The synchronous ``Lock``: the same operations over a sync backend.

    Args:
        backend: The lock backend (``SyncRedisLockBackend``).
        resource: The lock's name; locks of the same name on the same backend exclude
            each other.
        ttl: The lease length in seconds (> 0, at most a week); default 30.0. A holder
            that dies loses the lock after it.
        timeout: How long ``acquire`` waits by default, in seconds (0: a single
            attempt; at most a week); default 10.0.
        owner: A label for this lock's holders that ``inspect`` shows (as for
            ``Lock``); default None.

    Raises:
        TypeError: Seconds of the wrong type.
        ValueError: ``ttl`` <= 0, ``timeout`` < 0, either infinite or over a week, or
            a bad ``owner``.
    """

    def __init__(
        self,
        backend: SyncLockBackend,
        resource: str,
        *,
        ttl: float = 30.0,
        timeout: float = 10.0,
        owner: str | None = None,
    ) -> None:
        check_ttl(ttl)
        check_timeout(timeout)
        self.backend = backend
        self.resource = resource
        self.ttl = ttl
        self.timeout = timeout
        self.owner = check_owner(owner)

    def __repr__(self) -> str:
        return f"SyncLock({self.resource!r}, backend={self.backend.name}, ttl={self.ttl:g})"

    def acquire(self, *, timeout: float | None = None, ttl: float | None = None) -> Lease:
        """Wait up to ``timeout`` seconds for the lock; the ``Lease`` proves holding it.

        Args:
            timeout: How long to wait, in seconds (0: a single attempt); default None:
                the lock's ``timeout``.
            ttl: The lease length in seconds; default None: the lock's ``ttl``.

        Raises:
            LockNotAcquired: The lock was not free within ``timeout``.
            BackendUnavailable: The backend did not answer.
            ValueError: A bad ``ttl`` or ``timeout``.
        """
        with owned_by(self.owner):
            return self.backend.acquire(
                self.resource,
                self.ttl if ttl is None else ttl,
                self.timeout if timeout is None else timeout,
            )

    def inspect(self) -> LockState:
        """Who holds this lock now, and how many wait (``LockState``).

        Raises:
            TypeError: The backend cannot tell (it is no ``SyncInspectableLockBackend``).
            BackendUnavailable: The backend did not answer.
        """
        state: LockState = inspector(self.backend)(self.resource)
        return state

    def release(self, lease: Lease) -> None:
        """Release ``lease``.

        Args:
            lease: What ``acquire`` returned.

        Raises:
            LockNotOwned: The lease had lapsed (or been taken over): nothing was touched.
            BackendUnavailable: The backend did not answer.
        """
        self.backend.release(lease)

    def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        """Renew ``lease`` for ``ttl`` seconds from now; returns the renewed ``Lease``.

        Args:
            lease: The lease to renew (the latest one ``acquire`` or ``extend`` gave).
            ttl: The new length in seconds, from now; default None: the lock's ``ttl``.

        Raises:
            LockNotOwned: The lease had lapsed (or been taken over).
            BackendUnavailable: The backend did not answer.
        """
        return self.backend.extend(lease, self.ttl if ttl is None else ttl)

    @contextlib.contextmanager
    def hold(
        self, *, timeout: float | None = None, renew_every: float | None = None
    ) -> Iterator[Lease]:
        """Hold the lock for a ``with`` block, renewing it from a background thread.

        Sync code cannot be interrupted, so a lost lease is reported when the
        block ends, as ``LockLost``; use fencing tokens to protect writes.

        Args:
            timeout: How long to wait for the lock, in seconds; default None: the
                lock's ``timeout``.
            renew_every: Seconds between renewals, > 0 and < ``ttl``; default None: a
                third of the lock's ``ttl``.

        Raises:
            LockNotAcquired: The lock was not free within ``timeout``.
            LockLost: The lease could not be kept: it lapsed before the block began (as
                for ``Lock.hold()``), or while it ran, raised when the block ends.
            BackendUnavailable: The backend did not answer the acquire.
            ValueError: A bad ``renew_every``.
        """
        interval = _check_hold(self.ttl, renew_every, None)
        lease = self.acquire(timeout=timeout)
        lease = fresh_sync(
            lease, self.extend, ttl=self.ttl, interval=interval, release=self.release
        )
        renewal = SyncRenewal(
            [lease], self.extend, interval=interval, name=f"headway-renew-{self.resource}"
        )
        try:
            with renewal:
                yield lease
        finally:
            with contextlib.suppress(LockNotOwned, BackendUnavailable):
                self.release(lease)
        if renewal.lost is not None:
            raise LockLost(
                f"lock {self.resource!r} lost while held", resource=self.resource
            ) from renewal.lost
