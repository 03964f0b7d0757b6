"""``MultiLock``: several named locks taken all or nothing (``SyncMultiLock``, its twin
for threads, is in ``sync_multi``).

The names are sorted and de-duplicated, and always acquired in that order: two callers
wanting {a, b} and {b, a} both wait for ``a`` first, so neither can hold one while
waiting for the other's (no deadlock). A set that cannot be completed within the
timeout is released, as is one whose acquire is cancelled.

A backend that can take several locks in one step (``MultiAcquireBackend``: Redis, when
the names' keys share a slot) is asked first, all or nothing in one round trip; if a name
is busy, and the timeout allows waiting, the names are then taken one by one as above.
Such a backend also gives the set back in one step.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import TypeVar

from headway._clock import Clock, MonotonicClock
from headway._errors import BackendUnavailable, LockLost, LockNotAcquired, LockNotOwned
from headway.lock.capabilities import MultiAcquireBackend
from headway.lock.contract import LockBackend
from headway.lock.lease import Lease, check_timeout, check_ttl
from headway.lock.lock import _check_hold
from headway.lock.renewal import Renewal

__all__ = ["MultiLock"]

log = logging.getLogger("headway.lock")

E = TypeVar("E", bound=BaseException)


def _canonical(names: Iterable[str]) -> tuple[str, ...]:
    if isinstance(names, str):
        raise TypeError("names must be an iterable of str, not one str")
    listed = list(names)
    for name in listed:
        if not isinstance(name, str):
            raise TypeError(f"each name must be a str, not {type(name).__name__}")
    if not listed:
        raise ValueError("names must not be empty")
    return tuple(sorted(set(listed)))


def _first(errors: list[E], names: str) -> E | None:
    """The first of ``errors`` (the others logged), or None."""
    for extra in errors[1:]:
        log.warning("releasing %s: also %r", names, extra)
    return errors[0] if errors else None


def _lapsed(exc: LockNotOwned, waiting_for: str) -> LockNotAcquired:
    return LockNotAcquired(
        f"lease on {exc.resource!r} lapsed while waiting for {waiting_for!r}",
        resource=waiting_for,
    )


def _not_owned(lease: Lease) -> LockNotOwned:
    return LockNotOwned(
        f"cannot release lock {lease.resource!r}: the lease (fence {lease.fence}) is no "
        "longer held",
        resource=lease.resource,
    )


#: The longest one wait for a name lasts while earlier names are held, as a fraction
#: of the held leases' time left: past it they are renewed before waiting on.
_WAIT_SHARE = 0.5


class MultiLock:
    """Several named locks on one backend, acquired all or nothing.

    The names are sorted and de-duplicated (``names`` holds them so) and acquired in
    that order, so callers asking for overlapping sets in any order never deadlock.
    ``acquire`` returns one ``Lease`` per name, in that order, or holds none. A backend
    that offers ``acquire_many`` (``MultiAcquireBackend``: Redis, for names on one server
    or sharing a Cluster hash slot, such as ``{order:42}:items`` and
    ``{order:42}:payment``) takes a set that is free in one round trip, and releases it in
    one.

    Args:
        backend: The lock backend; the names are ``Lock`` names on it (a
            ``MultiLock`` over {"a", "b"} excludes ``Lock(backend, "a")``).
        names: The locks' names, in any order, repeats allowed; at least one.
        ttl: Each lease's length in seconds (> 0, at most a week); default 30.0.
        timeout: How long ``acquire`` waits by default for the whole set, in seconds
            (0: one attempt per name); default 10.0.
        clock: The monotonic clock of the timeout and of renewals; default None:
            ``time.monotonic``.

    Raises:
        TypeError: ``names`` is a str, or holds something else than a str.
        ValueError: ``names`` is empty, or a bad ``ttl`` or ``timeout``.
    """

    def __init__(
        self,
        backend: LockBackend,
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
        #: The backend, if it takes several locks in one step.
        self._many = backend if isinstance(backend, MultiAcquireBackend) else None

    def __repr__(self) -> str:
        return f"MultiLock({list(self.names)!r}, backend={self.backend.name}, ttl={self.ttl:g})"

    async def acquire(self, *, timeout: float | None = None) -> tuple[Lease, ...]:
        """Wait up to ``timeout`` seconds for every lock; one ``Lease`` per name, in order.

        The timeout bounds the whole set. While a name is awaited, the leases held
        already are renewed as needed. If the set is not complete in time, or the
        call is cancelled or fails, the leases taken so far are released.

        Args:
            timeout: How long to wait for the whole set, in seconds (0: one attempt
                per name); default None: the lock's ``timeout``.

        Raises:
            LockNotAcquired: Some lock was not free within ``timeout`` (its name is
                the error's ``resource``); none is held.
            BackendUnavailable: The backend did not answer; none is held.
            ValueError: A bad ``timeout``.
        """
        budget = check_timeout(self.timeout if timeout is None else timeout)
        backend, ttl, clock = self.backend, self.ttl, self.clock
        deadline = clock() + budget
        if self._many is not None and len(self.names) > 1:
            try:
                leases = await self._many.acquire_many(self.names, ttl)
            except LockNotAcquired:
                if budget == 0:
                    raise
                leases = None  # a name is busy: wait for them one by one, in order
            if leases is not None:
                return leases
        held: list[Lease] = []
        try:
            for name in self.names:
                while True:
                    now = clock()
                    left = max(0.0, deadline - now)
                    wait = left
                    if held:
                        wait = min(left, _WAIT_SHARE * min(h.remaining() for h in held))
                    try:
                        held.append(await backend.acquire(name, ttl, max(0.0, wait)))
                        break
                    except LockNotAcquired:
                        if wait >= left:
                            raise
                    # The held leases would run low before this one comes: renew them.
                    try:
                        held[:] = [await backend.extend(lease, ttl) for lease in held]
                    except LockNotOwned as exc:
                        raise _lapsed(exc, name) from exc
        except BaseException:
            await self._release_quietly(held)
            raise
        return tuple(held)

    async def _release_quietly(self, leases: list[Lease]) -> None:
        for lease in leases:
            try:
                await self.backend.release(lease)
            except (LockNotOwned, BackendUnavailable) as exc:
                log.warning("releasing %r after a failed acquire: %s", lease.resource, exc)

    async def release(self, leases: Iterable[Lease]) -> None:
        """Release every lease; if some release fails, the others are still released.

        Args:
            leases: What ``acquire`` returned.

        Raises:
            LockNotOwned: A lease had lapsed (the first such; the rest were released).
            BackendUnavailable: The backend did not answer for some lease (after
                trying all).
        """
        leases = list(leases)
        if self._many is not None:
            released = await self._many.release_many(leases)
            if released is not None:
                lapsed = [lease for lease, ok in zip(leases, released, strict=True) if not ok]
                if lapsed:
                    raise _not_owned(lapsed[0])
                return
        errors: list[LockNotOwned | BackendUnavailable] = []
        for lease in leases:
            try:
                await self.backend.release(lease)
            except (LockNotOwned, BackendUnavailable) as exc:
                errors.append(exc)
        if (error := _first(errors, repr(self.names))) is not None:
            raise error

    async def _release_held(
        self,
        renewals: list[Renewal],
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """At the end of ``hold()``'s block: release every lease at once (in one step if
        the backend can), after their renewals stopped; as ``Renewal`` would, a lease
        that lapsed unnoticed raises ``LockLost`` if the block ended cleanly."""
        try:
            await self.release([renewal.lease for renewal in reversed(renewals)])
        except LockNotOwned as err:
            if exc_type is None:
                raise LockLost(
                    f"lease on {err.resource!r} lapsed while held", resource=err.resource
                ) from err
        except BackendUnavailable as err:
            log.warning("releasing %s failed; they expire by their TTL: %s", self.names, err)
        return False

    @contextlib.asynccontextmanager
    async def hold(
        self,
        *,
        timeout: float | None = None,
        renew_every: float | None = None,
        max_hold: float | None = None,
    ) -> AsyncIterator[tuple[Lease, ...]]:
        """Hold every lock for an ``async with`` block, renewing each lease meanwhile.

        If any lease is lost (a refused renewal, or one that runs out), the block is
        cancelled and ``LockLost`` is raised, as for ``Lock.hold()``. Every lease is
        released when the block ends.

        Args:
            timeout: How long to wait for the whole set, in seconds; default None: the
                lock's ``timeout``.
            renew_every: Seconds between renewals, > 0 and < ``ttl``; default None: a
                third of ``ttl``.
            max_hold: The longest the block may run, in seconds; default None: no limit.

        Raises:
            LockNotAcquired: Some lock was not free within ``timeout``; none is held.
            LockLost: A lease could not be kept: it lapsed before the block began (as
                for ``Lock.hold()``; none is held then), or the block was cancelled.
            BackendUnavailable: The backend did not answer the acquire.
            ValueError: A bad ``timeout``, ``renew_every`` or ``max_hold``.
        """
        interval = _check_hold(self.ttl, renew_every, max_hold)
        leases = list(await self.acquire(timeout=timeout))
        renewals: list[Renewal] = []
        async with contextlib.AsyncExitStack() as stack:
            # Exited last: every renewal has stopped, then the set is released at once.
            stack.push_async_exit(functools.partial(self._release_held, renewals))
            for i in reversed(range(len(leases))):
                renewal = Renewal(
                    leases[i], self.backend.extend, ttl=self.ttl, interval=interval,
                    clock=self.clock, max_hold=max_hold,
                )  # fmt: skip
                try:
                    leases[i] = await renewal.begin()  # renewed first if it runs low
                except BaseException:
                    await self._release_quietly(leases[:i])  # the ones not begun yet
                    raise
                stack.push_async_exit(renewal.__aexit__)
                renewals.append(renewal)
            yield tuple(leases)
