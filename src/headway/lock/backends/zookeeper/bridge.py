"""kazoo's asynchronous calls as asyncio awaitables, without a thread per call.

kazoo writes requests and reads replies on its own connection thread and settles
each call's ``IAsyncResult`` from its completion thread. ``settled`` hooks a callback
onto that result which moves the outcome to the event loop with
``call_soon_threadsafe``; a watch fires the same way (``WatchWaker``). Errors that mean
"ZooKeeper could not answer" become ``BackendUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    OperationTimeoutError,
    SessionExpiredError,
)

from headway._errors import BackendUnavailable

__all__ = ["UNAVAILABLE", "WatchWaker", "settled", "unavailable"]

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


def settled(result: Any, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
    """A future on ``loop`` that settles with kazoo's async ``result``."""
    future: asyncio.Future[Any] = loop.create_future()

    def done(result: Any) -> None:  # on kazoo's completion thread
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle, future, result)

    result.rawlink(done)
    return future


class WatchWaker:
    """One waiter's wake-ups: a ZooKeeper watch (fired on kazoo's thread) sets its event."""

    __slots__ = ("event", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    def fire(self, _event: object = None) -> None:
        """The watch callback: wake the waiter (from any thread)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.event.set)

    async def wait(self, seconds: float) -> None:
        """Wait for a wake-up, at most ``seconds``; the next attempt decides (never handed)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.event.wait()
        self.event.clear()
