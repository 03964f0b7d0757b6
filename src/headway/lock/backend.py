"""Backend interfaces, and the driver shared by queued backends (Redis, memory).

``LockBackend`` / ``SyncLockBackend`` are what ``Lock`` and ``SyncLock`` need.
A queued backend only supplies four primitives (try, release, extend, leave)
and a way to wait for its wake-up; the drivers here run ``acquire_flow`` over
them and make every step safe under cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Protocol, TypeVar

from headway._clock import Clock, MonotonicClock
from headway._errors import LockNotOwned
from headway.lock.flow import Attempt, Leave, Listen, Try, Wait, acquire_flow
from headway.lock.lease import Lease, check_ttl

__all__ = [
    "AsyncWaiter",
    "LockBackend",
    "QueuedBackend",
    "SyncLockBackend",
    "SyncQueuedBackend",
    "SyncWaiter",
    "complete",
]

T = TypeVar("T")


class LockBackend(Protocol):
    """An async lock backend: grants, releases and extends leases."""

    name: str

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Return a lease on ``resource``, waiting up to ``timeout`` s, or raise LockNotAcquired."""
        ...

    async def release(self, lease: Lease) -> None:
        """Release the lease, or raise LockNotOwned if it is no longer held."""
        ...

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        """Renew the lease for ``ttl`` s from now, or raise LockNotOwned."""
        ...


class SyncLockBackend(Protocol):
    """The synchronous counterpart of ``LockBackend``."""

    name: str

    def acquire(self, resource: str, ttl: float, timeout: float) -> Lease: ...

    def release(self, lease: Lease) -> None: ...

    def extend(self, lease: Lease, ttl: float) -> Lease: ...


class AsyncWaiter(Protocol):
    async def wait(self, seconds: float) -> int | None:
        """Return when woken, or after ``seconds``: the fence if handed the lock, else None."""


class SyncWaiter(Protocol):
    def wait(self, seconds: float) -> int | None:
        """Return when woken, or after ``seconds``: the fence if handed the lock, else None."""


async def complete(aw: Awaitable[T], undo: Callable[[T], Awaitable[object]] | None = None) -> T:
    """Run ``aw`` to the end even if the caller is cancelled meanwhile.

    A request already sent has an effect we must know about: on cancellation
    the call is finished, ``undo`` (if given) reverses its result, and only then
    is the cancellation re-raised. Release and acquire go through here, so a
    cancelled task never strands a lock.
    """
    task = asyncio.ensure_future(aw)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            # We were cancelled, perhaps just as the call finished: its result
            # still needs undoing, so go round once more to collect it.
            cancelled = True
        except BaseException as exc:
            if cancelled:
                # The call failed after we were cancelled: the cancellation wins, or
                # ``asyncio.timeout`` and task cancellation counts would go astray.
                raise asyncio.CancelledError from exc
            raise
    if cancelled:
        if undo is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(asyncio.ensure_future(undo(result)))
        raise asyncio.CancelledError
    return result


def _renewed(lease: Lease, ttl_ms: int, sent: float) -> Lease:
    return Lease(lease.resource, lease.token, lease.fence, sent + ttl_ms / 1000, ttl_ms / 1000)


def _not_owned(lease: Lease, what: str) -> LockNotOwned:
    return LockNotOwned(
        f"cannot {what} lock {lease.resource!r}: the lease (fence {lease.fence}) is no longer held",
        resource=lease.resource,
    )


class QueuedBackend(ABC):
    """An async backend with a FIFO wait queue and wake-ups (see ``_flow``)."""

    name = "queued"
    #: Names this backend in its waiters' ids, for backends that hand a released lock
    #: to their own waiters directly (see ``lock_handoff.lua``).
    node = ""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or MonotonicClock()

    @abstractmethod
    async def _try(self, resource: str, step: Try) -> Attempt: ...

    @abstractmethod
    async def _release(self, resource: str, token: str) -> bool: ...

    @abstractmethod
    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool: ...

    @abstractmethod
    async def _leave(self, resource: str, waiter: str) -> None: ...

    @abstractmethod
    def _listen(self, resource: str, waiter: str) -> AbstractAsyncContextManager[AsyncWaiter]: ...

    def _listening(self, resource: str) -> bool:
        """True if wake-ups for ``resource`` already reach us, so ``_listen`` needs no I/O."""
        return False

    def _shielded(self) -> bool:
        """True if a call started now finishes, and a grant is undone, if its caller is cancelled.

        Then the drivers need no ``complete`` around it (a task and three loop turns
        a call). The Redis backend's pipelined connection is such: a call is written
        before its first await, and a reply nobody waits for goes to the call's
        ``orphan``.
        """
        return False

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Acquire ``resource`` (see ``LockBackend.acquire``)."""
        return await self._acquire(resource, ttl, timeout)

    async def _acquire(
        self,
        resource: str,
        ttl: float,
        timeout: float,
        token: str | None = None,
        began: float | None = None,
    ) -> Lease:
        flow = acquire_flow(resource, ttl, timeout, self.clock, token, self.node, began)
        step = next(flow)
        assert isinstance(step, Try)
        waiter, token = step.waiter, step.token

        async def undo(attempt: Attempt) -> None:
            if attempt.granted:
                await self._release(resource, token)
            elif waiter:
                await self._leave(resource, waiter)

        # Other tasks already wait here: listening is free, and listening before the
        # first attempt spares the retry that covers a late subscription.
        early = bool(waiter) and self._listening(resource)
        queued = False
        if not early:
            # The common case: one attempt, granted, with nothing to set up or clean up.
            attempt = await self._attempt(resource, step, undo)
            queued = bool(waiter) and not attempt.granted
            try:
                step = flow.send(attempt)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
        wake: AsyncWaiter | None = None
        async with contextlib.AsyncExitStack() as stack:
            try:
                if early:
                    wake = await stack.enter_async_context(self._listen(resource, waiter))
                while True:
                    if isinstance(step, Try):
                        attempt = await self._attempt(resource, step, undo)
                        queued = bool(waiter) and not attempt.granted
                        step = flow.send(attempt)
                    elif isinstance(step, Listen):
                        if wake is None:
                            wake = await stack.enter_async_context(self._listen(resource, waiter))
                        step = flow.send(early)
                    elif isinstance(step, Wait):
                        assert wake is not None
                        handed = await wake.wait(step.seconds)
                        queued = queued and handed is None  # handed the lock: no place left
                        step = flow.send(handed)
                    else:
                        assert isinstance(step, Leave)
                        queued = False
                        await complete(self._leave(resource, step.waiter))
                        step = flow.send(None)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            except BaseException:
                if queued:
                    with contextlib.suppress(Exception):
                        await complete(self._leave(resource, waiter))
                raise

    async def _attempt(
        self, resource: str, step: Try, undo: Callable[[Attempt], Awaitable[object]]
    ) -> Attempt:
        trying = self._try(resource, step)
        return await (trying if self._shielded() else complete(trying, undo))

    async def release(self, lease: Lease) -> None:
        """Release ``lease``; shielded from cancellation."""
        releasing = self._release(lease.resource, lease.token)
        if not await (releasing if self._shielded() else complete(releasing)):
            raise _not_owned(lease, "release")

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        """Extend ``lease`` to ``ttl`` seconds from now."""
        ttl_ms = check_ttl(ttl)
        sent = self.clock()
        if not await self._extend(lease.resource, lease.token, ttl_ms):
            raise _not_owned(lease, "extend")
        return _renewed(lease, ttl_ms, sent)


class SyncQueuedBackend(ABC):
    """The synchronous counterpart of ``QueuedBackend``: the same flow, driven by blocking calls."""

    name = "queued"
    node = ""  # as ``QueuedBackend.node``

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or MonotonicClock()

    @abstractmethod
    def _try(self, resource: str, step: Try) -> Attempt: ...

    @abstractmethod
    def _release(self, resource: str, token: str) -> bool: ...

    @abstractmethod
    def _extend(self, resource: str, token: str, ttl_ms: int) -> bool: ...

    @abstractmethod
    def _leave(self, resource: str, waiter: str) -> None: ...

    @abstractmethod
    def _listen(self, resource: str, waiter: str) -> AbstractContextManager[SyncWaiter]: ...

    def _listening(self, resource: str) -> bool:
        """True if wake-ups for ``resource`` already reach us, so ``_listen`` needs no I/O."""
        return False

    def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Acquire ``resource`` (see ``LockBackend.acquire``)."""
        flow = acquire_flow(resource, ttl, timeout, self.clock, node=self.node)
        step = next(flow)
        assert isinstance(step, Try)
        waiter = step.waiter
        queued = False
        wake: SyncWaiter | None = None
        early = False
        with contextlib.ExitStack() as stack:
            try:
                if waiter and self._listening(resource):
                    wake = stack.enter_context(self._listen(resource, waiter))
                    # Asked again with us registered (another thread may have dropped the
                    # subscription in between): subscribed now means before our attempt.
                    early = self._listening(resource)
                while True:
                    if isinstance(step, Try):
                        attempt = self._try(resource, step)
                        queued = bool(waiter) and not attempt.granted
                        step = flow.send(attempt)
                    elif isinstance(step, Listen):
                        if wake is None:
                            wake = stack.enter_context(self._listen(resource, waiter))
                        step = flow.send(early)
                    elif isinstance(step, Wait):
                        assert wake is not None
                        handed = wake.wait(step.seconds)
                        queued = queued and handed is None  # handed the lock: no place left
                        step = flow.send(handed)
                    else:
                        assert isinstance(step, Leave)
                        queued = False
                        self._leave(resource, step.waiter)
                        step = flow.send(None)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            except BaseException:
                if queued:
                    with contextlib.suppress(Exception):
                        self._leave(resource, waiter)
                raise

    def release(self, lease: Lease) -> None:
        """Release ``lease``."""
        if not self._release(lease.resource, lease.token):
            raise _not_owned(lease, "release")

    def extend(self, lease: Lease, ttl: float) -> Lease:
        """Extend ``lease`` to ``ttl`` seconds from now."""
        ttl_ms = check_ttl(ttl)
        sent = self.clock()
        if not self._extend(lease.resource, lease.token, ttl_ms):
            raise _not_owned(lease, "extend")
        return _renewed(lease, ttl_ms, sent)
