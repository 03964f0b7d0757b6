"""The driver of queued backends: one acquire flow over the primitives of ``contract``.

``QueuedBackend`` (async) and ``SyncQueuedBackend`` run ``acquire_flow`` over a
backend's primitives: they try, listen, wait, leave, and make every step safe
under cancellation (``run_to_end``), so a backend only says how to do each step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Generator
from typing import TypeVar

from headway._clock import Clock, MonotonicClock
from headway._errors import LockNotOwned
from headway.lock.contract import (
    AsyncWaiter,
    QueuedPrimitives,
    SyncQueuedPrimitives,
)
from headway.lock.flow import Attempt, Leave, Listen, Step, Try, Wait, acquire_flow
from headway.lock.lease import Lease, check_ttl

__all__ = ["QueuedBackend", "SyncQueuedBackend", "run_to_end"]

T = TypeVar("T")

Flow = Generator[Step, Attempt | bool | int | None, Lease]


async def run_to_end(aw: Awaitable[T], undo: Callable[[T], Awaitable[object]] | None = None) -> T:
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


def _cancels() -> int:
    """How many cancellations of the current task are pending: one that rises over a call
    was requested during it, even if the call swallowed its ``CancelledError``."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def _not_owned(lease: Lease, what: str) -> LockNotOwned:
    return LockNotOwned(
        f"cannot {what} lock {lease.resource!r}: the lease (fence {lease.fence}) is no longer held",
        resource=lease.resource,
    )


def _done(stop: StopIteration) -> Lease:
    lease = stop.value
    assert isinstance(lease, Lease)
    return lease


class QueuedBackend(QueuedPrimitives):
    """An async backend with a FIFO wait queue and wake-ups: subclass and implement
    the primitives of ``QueuedPrimitives``; acquire, release and extend come from here."""

    name = "queued"

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or MonotonicClock()

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Acquire ``resource`` (see ``LockBackend.acquire``)."""
        flow = acquire_flow(resource, ttl, timeout, self.clock, self.node)
        step = next(flow)
        assert isinstance(step, Try)
        waiter = step.waiter
        wake = self._join(resource, waiter) if waiter else None
        if wake is not None:
            return await self._drive(resource, flow, step, waiter, wake, queued=False)
        # The common case: one attempt, granted, with nothing to set up or clean up.
        attempt = await self._attempt(resource, step)
        try:
            step = flow.send(attempt)
        except StopIteration as done:
            return _done(done)
        return await self._drive(resource, flow, step, waiter, None, queued=bool(waiter))

    async def _drive(
        self,
        resource: str,
        flow: Flow,
        step: Step,
        waiter: str,
        wake: AsyncWaiter | None,
        queued: bool,
    ) -> Lease:
        """Run ``flow`` on from ``step``; ``wake`` is set if listening began before it.

        Not on the straight line (a first attempt granted returns before this), so its
        ending and its failure are steps of their own (``_received``, ``_give_up``)."""
        early = wake is not None
        cancels = _cancels()
        try:
            while True:
                if isinstance(step, Try):
                    attempt = await self._attempt(resource, step)
                    queued = bool(waiter) and not attempt.granted
                    step = flow.send(attempt)
                elif isinstance(step, Listen):
                    if wake is None:
                        wake = await self._listen(resource, waiter)
                    step = flow.send(early)
                elif isinstance(step, Wait):
                    assert wake is not None
                    handed = await wake.wait(step.seconds)
                    queued = queued and handed is None  # handed the lock: no place left
                    step = flow.send(handed)
                else:
                    assert isinstance(step, Leave)
                    queued = False
                    await run_to_end(self._leave(resource, step.waiter))
                    step = flow.send(None)
        except StopIteration as done:
            lease = _done(done)
        except BaseException as exc:
            await self._give_up(resource, waiter, wake, queued=queued)
            if _cancels() > cancels and not isinstance(exc, asyncio.CancelledError):
                raise asyncio.CancelledError from exc  # swallowed while leaving: still cancelled
            raise
        return await self._received(lease, waiter, wake, cancels)

    async def _received(
        self, lease: Lease, waiter: str, wake: AsyncWaiter | None, cancels: int
    ) -> Lease:
        """``lease``, granted after a wait, once listening has stopped; given back if the
        caller was cancelled meanwhile (``cancels``: those pending when the wait began)."""
        if wake is not None:
            try:
                await self._unlisten(lease.resource, waiter)
            except BaseException:
                await self._undo_grant(lease)
                raise
        if _cancels() > cancels:
            # A client library swallowed our cancellation (redis-py's pub/sub can, while
            # unsubscribing): the caller stopped waiting, so the grant goes back.
            await self._undo_grant(lease)
            raise asyncio.CancelledError
        return lease

    async def _give_up(
        self, resource: str, waiter: str, wake: AsyncWaiter | None, *, queued: bool
    ) -> None:
        """After the flow failed or was cancelled: leave the queue if still in it, and
        stop listening (even if cancelled again while leaving)."""
        try:
            if queued:
                with contextlib.suppress(Exception):
                    await run_to_end(self._leave(resource, waiter))
        finally:
            if wake is not None:
                await self._unlisten(resource, waiter)

    async def _undo_grant(self, lease: Lease) -> None:
        """Release a grant its caller will never receive (it was cancelled, or failed)."""
        with contextlib.suppress(Exception):
            await run_to_end(self._release(lease.resource, lease.token))

    async def _attempt(self, resource: str, step: Try) -> Attempt:
        if (ridden := self._ride(resource, step)) is not None:
            return ridden
        undo = functools.partial(self._undo, resource, step)
        return await self._safely(self._try(resource, step), undo)

    async def _undo(self, resource: str, step: Try, attempt: Attempt) -> None:
        """Reverse an attempt whose caller was cancelled: release the grant, or leave."""
        if attempt.granted:
            await self._release(resource, step.token)
        elif step.waiter:
            await self._leave(resource, step.waiter)

    def _safely(
        self, call: Awaitable[T], undo: Callable[[T], Awaitable[object]] | None = None
    ) -> Awaitable[T]:
        """``call``, finished (and undone) even if its caller is cancelled."""
        return call if self._shielded() else run_to_end(call, undo)

    async def release(self, lease: Lease) -> None:
        """Release ``lease``; shielded from cancellation."""
        if not await self._safely(self._release(lease.resource, lease.token)):
            raise _not_owned(lease, "release")

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        """Extend ``lease`` to ``ttl`` seconds from now."""
        ttl_ms = check_ttl(ttl)
        sent = self.clock()
        if not await self._extend(lease.resource, lease.token, ttl_ms):
            raise _not_owned(lease, "extend")
        return lease.renewed(ttl_ms, sent)


class SyncQueuedBackend(SyncQueuedPrimitives):
    """The synchronous ``QueuedBackend``: the same flow, driven by blocking calls."""

    name = "queued"

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or MonotonicClock()

    def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Acquire ``resource`` (see ``LockBackend.acquire``)."""
        flow = acquire_flow(resource, ttl, timeout, self.clock, self.node)
        step = next(flow)
        assert isinstance(step, Try)
        waiter = step.waiter
        wake = self._join(resource, waiter) if waiter else None
        early, queued = wake is not None, False
        try:
            while True:
                if isinstance(step, Try):
                    attempt = self._attempt(resource, step)
                    queued = bool(waiter) and not attempt.granted
                    step = flow.send(attempt)
                elif isinstance(step, Listen):
                    if wake is None:
                        wake = self._listen(resource, waiter)
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
            return _done(done)
        except BaseException:
            if queued:
                with contextlib.suppress(Exception):
                    self._leave(resource, waiter)
            raise
        finally:
            if wake is not None:
                self._unlisten(resource, waiter)

    def _attempt(self, resource: str, step: Try) -> Attempt:
        ridden = self._ride(resource, step)
        return self._try(resource, step) if ridden is None else ridden

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
        return lease.renewed(ttl_ms, sent)
