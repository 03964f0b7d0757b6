"""``SyncMultiLock``: ``MultiLock`` for threads, over a ``SyncLockBackend``.

The same rules (sorted names, one deadline, held leases renewed while waiting; see
``multi``), one name at a time: no sync backend takes several locks in one step.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator

from headway._clock import Clock, MonotonicClock
from headway._errors import BackendUnavailable, LockLost, LockNotAcquired, LockNotOwned
from headway.lock.contract import SyncLockBackend
from headway.lock.lease import Lease, check_timeout, check_ttl
from headway.lock.lock import _check_hold
from headway.lock.multi import _WAIT_SHARE, _canonical, _first, _lapsed
from headway.lock.renewal import SyncRenewal, fresh_sync

__all__ = ["SyncMultiLock"]

log = logging.getLogger("headway.lock")


class SyncMultiLock:
    """The synchronous ``MultiLock``: the same operations over a sync backend.

    Args:
        backend: The lock backend (``SyncRedisLockBackend``).
        names: The locks' names, in any order, repeats allowed; at least one.
        ttl: Each lease's length in seconds (> 0, at most a week); default 30.0.
        timeout: How long ``acquire`` waits by default for the whole set, in seconds
            (0: one attempt per name); default 10.0.
        clock: The monotonic clock of the timeout; default None: ``time.monotonic``.

    Raises:
        TypeError: ``names`` is a str, or holds something else than a str.
        ValueError: ``names`` is empty, or a bad ``ttl`` or ``timeout``.
    """

    def __init__(
        self,
        backend: SyncLockBackend,
        names: Iterable[str],
        *,
        ttl: float = 30.0,
        timeout: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        check_ttl(ttl)
        check_timeout(timeout)
        self.backend = backend
        self.names = _canonical(names)
        self.ttl = ttl
        self.timeout = timeout
        self.clock: Clock = clock or MonotonicClock()

    def __repr__(self) -> str:
        names = list(self.names)
        return f"SyncMultiLock({names!r}, backend={self.backend.name}, ttl={self.ttl:g})"

    def acquire(self, *, timeout: float | None = None) -> tuple[Lease, ...]:
        """As ``MultiLock.acquire``, blocking.

        Args:
            timeout: How long to wait for the whole set, in seconds (0: one attempt
                per name); default None: the lock's ``timeout``.

        Raises:
            LockNotAcquired: Some lock was not free within ``timeout``; none is held.
            BackendUnavailable: The backend did not answer; none is held.
            ValueError: A bad ``timeout``.
        """
        budget = check_timeout(self.timeout if timeout is None else timeout)
        backend, ttl, clock = self.backend, self.ttl, self.clock
        deadline = clock() + budget
        held: list[Lease] = []
        try:
            for name in self.names:
                while True:
                    left = max(0.0, deadline - clock())
                    wait = left
                    if held:
                        wait = min(left, _WAIT_SHARE * min(h.remaining() for h in held))
                    try:
                        held.append(backend.acquire(name, ttl, max(0.0, wait)))
                        break
                    except LockNotAcquired:
                        if wait >= left:
                            raise
                    try:
                        held[:] = [backend.extend(lease, ttl) for lease in held]
                    except LockNotOwned as exc:
                        raise _lapsed(exc, name) from exc
        except BaseException:
            self._release_quietly(held)
            raise
        return tuple(held)

    def _release_quietly(self, leases: Iterable[Lease]) -> None:
        for lease in leases:
            try:
                self.backend.release(lease)
            except (LockNotOwned, BackendUnavailable) as exc:
                log.warning("releasing %r after a failed acquire: %s", lease.resource, exc)

    def release(self, leases: Iterable[Lease]) -> None:
        """As ``MultiLock.release``, blocking.

        Args:
            leases: What ``acquire`` returned.

        Raises:
            LockNotOwned: A lease had lapsed (the first such; the rest were released).
            BackendUnavailable: The backend did not answer for some lease.
        """
        errors: list[LockNotOwned | BackendUnavailable] = []
        for lease in leases:
            try:
                self.backend.release(lease)
            except (LockNotOwned, BackendUnavailable) as exc:
                errors.append(exc)
        if (error := _first(errors, repr(self.names))) is not None:
            raise error

    @contextlib.contextmanager
    def hold(
        self, *, timeout: float | None = None, renew_every: float | None = None
    ) -> Iterator[tuple[Lease, ...]]:
        """Hold every lock for a ``with`` block, renewing them from a background thread.

        As ``SyncLock.hold()``: sync code cannot be interrupted, so a lost lease is
        reported when the block ends, as ``LockLost``. Every lease is released then.

        Args:
            timeout: How long to wait for the whole set, in seconds; default None: the
                lock's ``timeout``.
            renew_every: Seconds between renewals, > 0 and < ``ttl``; default None: a
                third of ``ttl``.

        Raises:
            LockNotAcquired: Some lock was not free within ``timeout``; none is held.
            LockLost: A lease could not be kept: it lapsed before the block began
                (none is held then), or while it ran, raised when the block ends.
            BackendUnavailable: The backend did not answer the acquire.
            ValueError: A bad ``timeout`` or ``renew_every``.
        """
        interval = _check_hold(self.ttl, renew_every, None)
        leases = self.acquire(timeout=timeout)
        try:
            leases = tuple(
                fresh_sync(lease, self.backend.extend, ttl=self.ttl, interval=interval)
                for lease in leases
            )
        except BaseException:
            self._release_quietly(leases)
            raise
        renewal = SyncRenewal(
            leases,
            lambda lease: self.backend.extend(lease, self.ttl),
            interval=interval,
            name="headway-renew-multi",
        )
        try:
            with renewal:
                yield leases
        finally:
            with contextlib.suppress(LockNotOwned, BackendUnavailable):
                self.release(leases)
        if (lost := renewal.lost) is not None:
            resource = getattr(lost, "resource", None) or self.names[0]
            raise LockLost(f"lock {resource!r} lost while held", resource=resource) from lost
