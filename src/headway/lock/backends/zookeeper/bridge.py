"""kazoo's asynchronous calls as asyncio awaitables, without a thread per call.

kazoo writes requests and reads replies on its own connection thread. ``settled`` hooks
a callback onto a call's ``IAsyncResult`` which moves the outcome to the event loop with
``call_soon_threadsafe``; a watch fires the same way (``WatchWaker``). With the backend's
own ``InlineHandler`` both run straight on the connection thread instead of going
through kazoo's completion thread first (docs/decisions/lock.md: "ZooKeeper replies
skip kazoo's completion thread"). Errors that mean "ZooKeeper could not answer" become
``BackendUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import select
from typing import Any

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import AsyncResult, SequentialThreadingHandler
from kazoo.handlers.utils import fileobj_to_fd
from kazoo.protocol.states import Callback, EventType

from headway._errors import BackendUnavailable

__all__ = ["UNAVAILABLE", "InlineHandler", "WatchWaker", "settled", "unavailable"]

#: kazoo errors after which the request's fate is unknown or the session must be
#: re-established: the caller may retry later.
UNAVAILABLE = (
    ConnectionLoss,
    ConnectionClosedError,
    OperationTimeoutError,
    SessionExpiredError,
    TimeoutError,
)


def unavailable(exc: BaseException, timeout: float) -> BackendUnavailable:
    """The ``BackendUnavailable`` raised for ``exc``."""
    what = "did not answer" if isinstance(exc, TimeoutError) else "failed"
    return BackendUnavailable(
        f"ZooKeeper {what} within {timeout:g} s: {type(exc).__name__} {exc}".rstrip(),
        backend="zookeeper",
    )


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():  # the caller gave up (timeout, cancellation)
        return
    try:
        value = result.get_nowait()
    except Exception as exc:
        future.set_exception(exc)
    else:
        future.set_result(value)


class _Hop:
    """A result callback that only hands the result to the loop: safe to run on any
    thread, kazoo's connection thread included (it never blocks)."""

    __slots__ = ("future", "loop")

    def __init__(self, future: asyncio.Future[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.future, self.loop = future, loop

    def __call__(self, result: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self.loop.call_soon_threadsafe(_settle, self.future, result)


def settled(result: Any, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
    """A future on ``loop`` that settles with kazoo's async ``result``."""
    future: asyncio.Future[Any] = loop.create_future()
    result.rawlink(_Hop(future, loop))
    return future


def poll_ready(
    rlist: list[Any], wlist: list[Any], timeout: float | None
) -> tuple[list[Any], list[Any], list[Any]]:
    """The objects of ``rlist`` and ``wlist`` ready to read or write (or failed, so that
    the next call on them raises), after at most ``timeout`` seconds (None: no limit)."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    asked = [(obj, select.POLLIN) for obj in rlist] + [(obj, select.POLLOUT) for obj in wlist]
    masks: dict[int, int] = {}
    for fileobj, mask in asked:
        fd = fileobj_to_fd(fileobj)
        masks[fd] = masks.get(fd, 0) | mask
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ready = dict(poller.poll(None if timeout is None else math.ceil(timeout * 1000)))
    failed = select.POLLERR | select.POLLHUP | select.POLLNVAL

    def chosen(objs: list[Any], mask: int) -> list[Any]:
        return [obj for obj in objs if ready.get(fileobj_to_fd(obj), 0) & (mask | failed)]

    return chosen(rlist, select.POLLIN), chosen(wlist, select.POLLOUT), []


class _InlineResult(AsyncResult):  # type: ignore[misc]
    """kazoo's result, running headway's hops where it is set; other callbacks (kazoo's
    own, which may block) still go to the completion thread."""

    def _do_callbacks(self) -> None:
        for callback in self._callbacks:
            if isinstance(callback, _Hop) or not self._handler.running:
                callback(self)
            else:
                self._handler.completion_queue.put(functools.partial(callback, self))


class InlineHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler, but the backend's hops and watch wake-ups run on the
    connection thread: each reply and watch event reaches the loop one thread hop sooner."""

    def async_result(self) -> AsyncResult:
        return _InlineResult(self)

    if hasattr(select, "poll"):

        def select(
            self, rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None = None
        ) -> tuple[list[Any], list[Any], list[Any]]:
            """kazoo's ``select``, as one ``poll`` call: kazoo's own builds, registers and
            closes an epoll selector per call, four of them per request and reply."""
            return poll_ready(rlist, wlist, timeout)

    def dispatch_callback(self, callback: Callback) -> None:
        if isinstance(getattr(callback.func, "__self__", None), WatchWaker):
            callback.func(*callback.args)
        else:
            super().dispatch_callback(callback)


class WatchWaker:
    """One waiter's wake-ups: a ZooKeeper watch (fired on kazoo's thread) sets its event.

    ``expect`` names the nodes whose deletion alone grants the waiter; ``granted`` then
    says whether they all were deleted since, so the waiter needs no listing to know it
    is first.
    """

    __slots__ = ("event", "follows", "heard", "loop", "pending")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()
        self.pending: set[str] | None = None  # the paths still to be deleted; None: look
        self.heard = 0.0  # loop time, no later than the server last heard the session
        self.follows: str | None = None  # the node whose holder may hand it over (queue)

    def expect(self, paths: set[str] | None, heard: float) -> None:
        """Before the watches are set: the waiter holds the lock once every one of
        ``paths`` is deleted (None: a wake-up only says to look again). ``heard``: a
        loop time no later than the server's last request from this session, which
        the session outlives by its timeout (a grant without a request bounds the
        lease by it)."""
        self.pending = paths
        self.heard = heard

    def fire(self, event: Any = None) -> None:
        """The watch callback: wake the waiter (from any thread)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._fired, event)

    def _fired(self, event: Any) -> None:
        if self.pending is not None:
            if getattr(event, "type", None) == EventType.DELETED:
                self.pending.discard(event.path)
            else:  # anything but a deletion of what it waits for: look again
                self.pending = None
        self.event.set()

    def granted(self) -> bool:
        """Whether every expected node was deleted since ``expect`` (then forgotten)."""
        done = self.pending is not None and not self.pending
        self.pending = None
        return done

    async def wait(self, seconds: float) -> None:
        """Wait for a wake-up, at most ``seconds``; the next attempt decides (never handed)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.event.wait()
        self.event.clear()
