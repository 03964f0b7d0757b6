"""``Renewal``: the one watchdog that keeps a lease alive while a block runs.

``Lock.hold()``, ``ConcurrencyLimiter.hold()`` (a slot's lease) and the
idempotency middleware (a request's lock and record leases) all hold their
leases through it, so a lease is renewed, lost and reported one way: a refused
renewal, a lease that runs out before a renewal gets through, or ``max_hold``
cancels the block, and the block ends in ``LockLost``. ``SyncRenewal`` is its
thread twin, for ``SyncLock.hold()`` and ``SyncMultiLock.hold()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

from headway._clock import Clock
from headway._errors import BackendUnavailable, LockLost, LockNotOwned
from headway.lock.lease import Lease

__all__ = ["Renewal", "SyncRenewal", "fresh", "fresh_sync"]

log = logging.getLogger("headway.lock")

#: ``renew(lease, ttl)``: the lease renewed for ``ttl`` s from now; ``LockNotOwned`` if
#: refused, ``BackendUnavailable`` (or a timeout) if it could not be asked, and is retried.
Renew = Callable[[Lease, float], Awaitable[Lease]]


def _stale(lease: Lease, interval: float, now: float) -> bool:
    return lease.deadline - now < interval


def _lapsed(lease: Lease) -> LockLost:
    message = f"lease on {lease.resource!r} lapsed before it was held"
    return LockLost(message, resource=lease.resource)


async def fresh(
    lease: Lease,
    renew: Renew,
    *,
    ttl: float,
    interval: float,
    now: float,
    release: Callable[[Lease], Awaitable[None]] | None = None,
) -> Lease:
    """``lease``, renewed first if less than ``interval`` s of it are left at ``now``.

    A lease handed over to a waiter counts from the waiter's last refused attempt (so
    its deadline never overstates the store's), which may be most of a TTL before the
    hand-over: held as it is, its first renewal would come after its deadline. The
    store knows whether it is still held, so it is asked rather than the deadline
    believed. A renewal that fails otherwise (the store down, the caller cancelled)
    gives the lease back with ``release``, if given, and lets the error through.

    Raises:
        LockLost: The renewal was refused (``LockNotOwned``): the lease lapsed.
    """
    if not _stale(lease, interval, now):
        return lease
    try:
        return await renew(lease, ttl)
    except LockNotOwned as exc:
        raise _lapsed(lease) from exc
    except BaseException:
        if release is not None:
            with contextlib.suppress(LockNotOwned, BackendUnavailable):
                await release(lease)
        raise


def fresh_sync(
    lease: Lease,
    renew: Callable[[Lease, float], Lease],
    *,
    ttl: float,
    interval: float,
    release: Callable[[Lease], None] | None = None,
) -> Lease:
    """``fresh`` for a sync holder, on the monotonic clock (``Lease.remaining``)."""
    if lease.remaining() >= interval:
        return lease
    try:
        return renew(lease, ttl)
    except LockNotOwned as exc:
        raise _lapsed(lease) from exc
    except BaseException:
        if release is not None:
            with contextlib.suppress(LockNotOwned, BackendUnavailable):
                release(lease)
        raise


class Renewal:
    """Renew ``lease`` every ``interval`` s while an ``async with`` block runs.

    Each renewal asks for ``ttl`` s (less near ``max_hold``, counted from the
    block's start). A lease with less than ``interval`` s left is renewed before the
    block starts (``fresh``). The first renewal after that is a timer; the renewing task starts only
    when it fires, so a block that ends sooner costs a timer and no task. When
    the lease is lost the task running the block is cancelled and the block
    raises ``LockLost`` instead (an outside cancellation stays one). ``release``,
    if given, gives the lease back when the block ends; a lease that lapsed
    unnoticed then raises ``LockLost`` if the block had ended cleanly.
    """

    __slots__ = (
        "_clock",
        "_interval",
        "_max_hold",
        "_owner",
        "_reason",
        "_release",
        "_renew",
        "_started",
        "_task",
        "_timer",
        "_ttl",
        "lease",
    )

    def __init__(
        self,
        lease: Lease,
        renew: Renew,
        *,
        ttl: float,
        interval: float,
        clock: Clock,
        max_hold: float | None = None,
        release: Callable[[Lease], Awaitable[None]] | None = None,
    ) -> None:
        #: The current lease (its deadline moves with each renewal).
        self.lease = lease
        self._renew = renew
        self._ttl = ttl
        self._interval = interval
        self._clock = clock
        self._max_hold = max_hold
        self._release = release
        self._reason: BaseException | None = None
        self._owner: asyncio.Task[object] | None = None
        self._started = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Lease:
        return await self.begin()

    async def begin(self) -> Lease:
        """``start``, after renewing a lease with less than ``interval`` s left (``fresh``:
        ``LockLost`` if the renewal is refused; on another error the lease is released)."""
        ttl = self._ttl if self._max_hold is None else min(self._ttl, self._max_hold)
        self.lease = await fresh(
            self.lease, self._renew, ttl=ttl, interval=self._interval, now=self._clock(),
            release=self._release,
        )  # fmt: skip
        return self.start()

    def start(self) -> Lease:
        """Watch the lease from now, for the task running this (``begin`` without the
        check: for a lease known to be fresh)."""
        self._owner = asyncio.current_task()
        self._started = started = self._clock()
        due = min(started + self._interval, self.lease.deadline) - started
        self._timer = asyncio.get_running_loop().call_later(max(0.0, due), self._start)
        return self.lease

    def _start(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def _lose(self, reason: BaseException) -> None:
        self._reason = reason
        assert self._owner is not None
        self._owner.cancel(f"lease on {self.lease.resource!r} lost")

    async def _watch(self) -> None:
        clock, lease, started = self._clock, self.lease, self._started
        renew_at = started + self._interval
        capped = False  # the last renewal was shortened to end at max_hold
        while True:
            await asyncio.sleep(max(0.0, min(renew_at, lease.deadline) - clock()))
            now = clock()
            ttl = self._ttl
            if self._max_hold is not None and started + self._max_hold - now < ttl:
                ttl = started + self._max_hold - now
                if ttl <= 0:
                    capped = True
            if ttl <= 0 or now >= lease.deadline:
                why = "max_hold reached" if capped else "lease ran out before it was renewed"
                self._lose(LockLost(f"{why} on {lease.resource!r}", resource=lease.resource))
                return
            capped = ttl < self._ttl
            try:
                async with asyncio.timeout(lease.deadline - now):
                    lease = self.lease = await self._renew(lease, ttl)
                renew_at = clock() + self._interval
            except LockNotOwned as exc:
                self._lose(exc)
                return
            except (BackendUnavailable, TimeoutError) as exc:
                log.warning("renewing %r failed, retrying: %s", lease.resource, exc)
                renew_at = clock() + min(self._interval, 0.1)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._timer is not None:
            self._timer.cancel()  # a short block: no renewal ran, nothing can have been lost
        lost = None if self._task is None else await self._stop(exc_type)
        lease = self.lease
        if self._release is not None:
            try:
                await self._release(lease)
            except LockNotOwned as err:
                if self._reason is None and exc_type is None:
                    raise LockLost(
                        f"lease on {lease.resource!r} lapsed while held", resource=err.resource
                    ) from err
            except BackendUnavailable as err:
                log.warning("releasing %r failed; it expires by its TTL: %s", lease.resource, err)
        if lost is not None:
            if isinstance(lost, LockLost):
                raise lost
            raise LockLost(
                f"lease on {lease.resource!r} lost: {lost}", resource=lease.resource
            ) from lost
        return False

    async def _stop(self, exc_type: type[BaseException] | None) -> BaseException | None:
        """Stop the renewing task; why the lease was lost, if that (alone) cancelled the block."""
        task, owner = self._task, self._owner
        assert task is not None
        assert owner is not None
        task.cancel()
        reason, other_cancel = self._reason, False
        if reason is not None:
            if exc_type is not asyncio.CancelledError:
                # The block ended before our cancellation reached it: absorb it now.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0)
            other_cancel = owner.uncancel() > 0
        await asyncio.wait([task])
        return None if other_cancel else reason


class SyncRenewal:
    """Renew ``leases`` every ``interval`` s from a daemon thread while a ``with`` block
    runs (``SyncLock.hold()``, ``SyncMultiLock.hold()``).

    Sync code cannot be interrupted, so a loss is only recorded (``lost``: the first
    refusal, or an outage that outlasted the lease) and renewing stops; the holder
    raises ``LockLost`` when its block ends. Leaving the block stops the thread and
    waits for it.
    """

    __slots__ = ("_done", "_extend", "_interval", "_leases", "_thread", "lost")

    def __init__(
        self,
        leases: Sequence[Lease],
        extend: Callable[[Lease], Lease],
        *,
        interval: float,
        name: str,
    ) -> None:
        self._leases = list(leases)
        self._extend = extend
        self._interval = interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=name, daemon=True)
        #: Why a lease was lost (``LockNotOwned`` or ``BackendUnavailable``), or None.
        self.lost: LockNotOwned | BackendUnavailable | None = None

    def _renew(self) -> None:
        current = self._leases
        while not self._done.wait(self._interval):
            for i, lease in enumerate(current):
                try:
                    current[i] = self._extend(lease)
                except LockNotOwned as exc:
                    self.lost = exc
                    return
                except BackendUnavailable as exc:
                    if lease.remaining() <= 0:
                        self.lost = exc
                        return

    def __enter__(self) -> None:
        self._thread.start()

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()
