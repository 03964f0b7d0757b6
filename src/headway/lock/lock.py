"""``Lock``: one named lock over an async backend, and ``hold()`` (``SyncLock``, its
synchronous twin, is in ``sync_lock``)."""

from __future__ import annotations

from collections.abc import Awaitable
from types import TracebackType
from typing import Any

from headway._clock import Clock, MonotonicClock
from headway._errors import BackendUnavailable, LockNotAcquired, LockNotOwned
from headway.lock.contract import LockBackend
from headway.lock.events import LockEvent, LockEventKind, LockHook, report
from headway.lock.introspection import LockState, check_owner, owned_by
from headway.lock.lease import Lease, _finite_seconds, check_timeout, check_ttl
from headway.lock.renewal import Renewal

__all__ = ["Lock", "inspector"]


def inspector(backend: object) -> Any:
    """The backend's ``inspect``, or a TypeError naming what it lacks."""
    inspect = getattr(backend, "inspect", None)
    if inspect is None:
        name = getattr(backend, "name", type(backend).__name__)
        raise TypeError(f"the {name} lock backend cannot tell who holds a lock (no inspect)")
    return inspect


def _check_hold(ttl: float, renew_every: float | None, max_hold: float | None) -> float:
    interval = ttl / 3 if renew_every is None else _finite_seconds("renew_every", renew_every)
    if not 0 < interval < ttl:
        raise ValueError(f"renew_every must be > 0 and < ttl ({ttl:g} s), got {interval!r}")
    if max_hold is not None and _finite_seconds("max_hold", max_hold) <= 0:
        raise ValueError(f"max_hold must be > 0, got {max_hold!r}")
    return interval


class Lock:
    """A named lock over an async backend.

    The lock object holds no lease: every ``acquire`` returns a new ``Lease``,
    so tasks sharing one ``Lock`` never share a lease.

    Args:
        backend: The lock backend (``RedisLockBackend``, ``PostgresLockBackend``...).
        resource: The lock's name; locks of the same name on the same backend exclude
            each other.
        ttl: The lease length in seconds (> 0, at most a week); default 30.0. A holder
            that dies loses the lock after it.
        timeout: How long ``acquire`` waits by default, in seconds (0: a single
            attempt; at most a week); default 10.0.
        clock: The monotonic clock of renewals and of the event hook's times; default
            None: ``time.monotonic``.
        on_event: A ``LockHook`` told each acquire's wait and each lease's hold time
            (``LockEvent``); default None: nothing is timed.
        owner: A label for this lock's holders (1 to 64 printable ASCII characters, e.g.
            a host name and pid) that ``inspect`` shows to whoever asks who holds the
            lock; default None: holders are anonymous.

    Raises:
        TypeError: ``resource`` is not a str, or seconds of the wrong type.
        ValueError: ``ttl`` <= 0, ``timeout`` < 0, either infinite or over a week, or
            a bad ``owner``.
    """

    def __init__(
        self,
        backend: LockBackend,
        resource: str,
        *,
        ttl: float = 30.0,
        timeout: float = 10.0,
        clock: Clock | None = None,
        on_event: LockHook | None = None,
        owner: str | None = None,
    ) -> None:
        check_ttl(ttl)
        check_timeout(timeout)
        if not isinstance(resource, str):
            raise TypeError(f"resource must be a str, not {type(resource).__name__}")
        self.backend = backend
        self.resource = resource
        self.ttl = ttl
        self.timeout = timeout
        self.owner = check_owner(owner)
        self.clock: Clock = clock or MonotonicClock()
        self.on_event = on_event
        # When each lease this lock granted was acquired (by token), for hold times;
        # bounded, as leases left to expire are never released.
        self._since: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"Lock({self.resource!r}, backend={self.backend.name}, ttl={self.ttl:g})"

    async def acquire(self, *, timeout: float | None = None, ttl: float | None = None) -> Lease:
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
        if self.owner is None:
            return await self._acquire(timeout, ttl)
        with owned_by(self.owner):
            return await self._acquire(timeout, ttl)

    async def inspect(self) -> LockState:
        """Who holds this lock now, and how many wait (``LockState``).

        Raises:
            TypeError: The backend cannot tell (it is no ``InspectableLockBackend``).
            BackendUnavailable: The backend did not answer.
        """
        state: LockState = await inspector(self.backend)(self.resource)
        return state

    async def _acquire(self, timeout: float | None, ttl: float | None) -> Lease:
        pending = self.backend.acquire(
            self.resource,
            self.ttl if ttl is None else ttl,
            self.timeout if timeout is None else timeout,
        )
        if self.on_event is None:  # the hot path: nothing timed
            return await pending
        started = self.clock()
        try:
            lease = await pending
        except LockNotAcquired:
            self._event("not_acquired", waited=self.clock() - started)
            raise
        except BackendUnavailable:  # a cancellation is not an outcome: not reported
            self._event("errored", waited=self.clock() - started)
            raise
        now = self.clock()
        self._event("acquired", waited=now - started, fence=lease.fence)
        if len(self._since) >= 4096:
            del self._since[next(iter(self._since))]
        self._since[lease.token] = now
        return lease

    async def release(self, lease: Lease) -> None:
        """Release ``lease``, shielded from cancellation.

        Args:
            lease: What ``acquire`` returned.

        Raises:
            LockNotOwned: The lease had lapsed (or been taken over): nothing was touched.
            BackendUnavailable: The backend did not answer.
        """
        if self.on_event is None:
            return await self.backend.release(lease)
        kind: LockEventKind = "released"
        try:
            await self.backend.release(lease)
        except LockNotOwned:
            kind = "lost"
            raise
        except BackendUnavailable:
            kind = "errored"
            raise
        finally:  # a cancelled release (shielded: it carries on) counts as released
            since = self._since.pop(lease.token, None)
            held = None if since is None else self.clock() - since
            self._event(kind, held=held, fence=lease.fence)

    def _event(
        self,
        kind: LockEventKind,
        *,
        waited: float | None = None,
        held: float | None = None,
        fence: int | None = None,
    ) -> None:
        assert self.on_event is not None
        event = LockEvent(kind, self.resource, self.backend.name, waited, held, fence)
        report(self.on_event, event)

    async def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        """Renew ``lease`` for ``ttl`` seconds from now; returns the renewed ``Lease``.

        Args:
            lease: The lease to renew (the latest one ``acquire`` or ``extend`` gave).
            ttl: The new length in seconds, from now; default None: the lock's ``ttl``.

        Raises:
            LockNotOwned: The lease had lapsed (or been taken over).
            BackendUnavailable: The backend did not answer.
        """
        return await self.backend.extend(lease, self.ttl if ttl is None else ttl)

    def hold(
        self,
        *,
        timeout: float | None = None,
        renew_every: float | None = None,
        max_hold: float | None = None,
    ) -> _Hold:
        """Hold the lock for an ``async with`` block, renewing the lease meanwhile.

        The lease is renewed every ``renew_every`` s (default: a third of the
        TTL), and before the block starts if less than that is left of it (a lease
        handed over after a long wait counts from before the wait). If a renewal is
        refused, or the lease runs out because Redis does not answer, or the block
        outlives ``max_hold`` s, the block is cancelled and ``LockLost`` is raised:
        the holder never keeps working unknowingly.

        Args:
            timeout: How long to wait for the lock, in seconds; default None: the
                lock's ``timeout``.
            renew_every: Seconds between renewals, > 0 and < ``ttl``; default None: a
                third of the lock's ``ttl``.
            max_hold: The longest the block may run, in seconds; default None: no limit.

        Raises:
            LockNotAcquired: The lock was not free within ``timeout``.
            LockLost: The lease could not be kept: it lapsed before the block began (a
                lease handed over after a long wait is renewed first, and that was
                refused), or while the block ran, which was cancelled.
            BackendUnavailable: The backend did not answer the acquire.
            ValueError: A bad ``renew_every`` or ``max_hold``.
        """
        interval = _check_hold(self.ttl, renew_every, max_hold)
        return _Hold(self, timeout, interval, max_hold)


class _Hold:
    """``Lock.hold()``'s context manager: acquire on entry, then the lease's ``Renewal``."""

    __slots__ = ("_interval", "_lock", "_max_hold", "_renewal", "_timeout")

    def __init__(
        self, lock: Lock, timeout: float | None, interval: float, max_hold: float | None
    ) -> None:
        self._lock = lock
        self._timeout = timeout
        self._interval = interval
        self._max_hold = max_hold
        self._renewal: Renewal | None = None

    @property
    def lease(self) -> Lease:
        """The current lease (its deadline moves with each renewal)."""
        assert self._renewal is not None, "not held"
        return self._renewal.lease

    async def __aenter__(self) -> Lease:
        lock = self._lock
        lease = await lock.acquire(timeout=self._timeout)
        self._renewal = Renewal(
            lease, lock.extend, ttl=lock.ttl, interval=self._interval, clock=lock.clock,
            max_hold=self._max_hold, release=lock.release,
        )  # fmt: skip
        return await self._renewal.begin()

    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Awaitable[bool]:
        # The renewal's own exit, returned rather than awaited: one coroutine less per hold.
        assert self._renewal is not None
        return self._renewal.__aexit__(exc_type, exc, tb)
