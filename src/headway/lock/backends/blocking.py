"""Sync twins of async lock backends: the async backend, run on a private event loop.

``BlockingLockBackend`` (and ``BlockingModalLockBackend``, which adds ``for_mode``)
turns any ``LockBackend`` into a ``SyncLockBackend``: each call is sent, as a task, to
an event loop of its own in a daemon thread (started on first use, stopped by
``close``) and the calling thread waits for its outcome. One flow, one set of
server scripts and statements: the sync twin is only this shell, two thread hand-offs
a call (~25-110 µs on a loaded 2-core VM, within a round trip's noise;
``benchmarks/README.md``).

- **Made here, used there.** The async backend is built in the caller's thread (so a
  bad argument is refused at once) and does its first I/O on the private loop: its
  clients (asyncpg, redis-py, httpx, kazoo) bind to a loop when they first connect,
  not when they are made. So the twins take URLs and options, never a client or an
  engine: one already used on another loop would hand its connections to the wrong
  one. A backend wrapped here must not be used elsewhere.
- **Errors pass unchanged**: ``LockNotAcquired``, ``LockNotOwned``,
  ``BackendUnavailable``, ``ValueError``, ``TypeError`` come out as the async backend
  raised them. A call made after ``close``, or still running when it stops the loop,
  raises ``BackendUnavailable`` (the store can no longer be reached through it).
- **An interrupted call leaves nothing behind.** If the waiting thread is interrupted
  (``KeyboardInterrupt``), the task is cancelled and the thread waits until it has
  ended: the async backend's cancellation rules apply (an acquire leaves no place in
  line, a release finishes). A lease granted as the interruption came is released
  before the interruption goes on.
- **From async code** the calls still work (the loop is not the caller's), blocking
  the caller's loop while they wait, as any sync call does. A call from the private
  loop's own thread (a callback of the async backend) is refused: it would wait for
  itself.
- **Fork**: a backend whose loop has started belongs to that process; a forked child
  that calls it gets ``RuntimeError`` (its connections are the parent's). Make the
  backend in the child, or in the parent before its first call: the loop starts on
  first use, in whichever process makes it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from headway._errors import BackendUnavailable
from headway.lock.contract import LockBackend, ModalLockBackend, SyncLockBackend
from headway.lock.introspection import LockState
from headway.lock.lease import Lease
from headway.lock.modes import LockMode, ModeKind

__all__ = ["BlockingLockBackend", "BlockingModalLockBackend", "PrivateLoop"]

T = TypeVar("T")


class _Call(Generic[T]):
    """One coroutine sent to the loop; ``done`` is set once it has ended, however."""

    def __init__(self, coroutine: Coroutine[Any, Any, T], backend: str) -> None:
        self.coroutine = coroutine
        self.backend = backend
        self.task: asyncio.Task[T] | None = None
        self.done = threading.Event()
        self.returned = False
        self.result: T | None = None
        self.error: BaseException | None = None

    def start(self) -> None:  # on the loop
        if self.done.is_set():
            return  # cancelled before it started
        # The task runs in a copy of the caller's context (``call_soon_threadsafe``
        # took it): context variables set in the calling thread are seen.
        self.task = asyncio.get_running_loop().create_task(self.coroutine)
        self.task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[T]) -> None:
        if task.cancelled():
            self.error = BackendUnavailable(
                "the lock backend was closed while the call ran", backend=self.backend
            )
        elif (error := task.exception()) is not None:
            self.error = error
        else:
            self.result, self.returned = task.result(), True
        self.done.set()

    def cancel(self) -> None:  # on the loop
        if self.task is None:
            self.coroutine.close()
            self.done.set()
        else:
            self.task.cancel()

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class PrivateLoop:
    """An event loop in a daemon thread of its own, started on first use.

    Args:
        name: Names the thread (``headway-<name>``).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._guard = threading.Lock()
        self._running: _Running | None = None
        self._closed = False

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._closed:
                raise BackendUnavailable(
                    f"the {self.name} lock backend is closed", backend=self.name
                )
            running = self._running = self._running or self._start()
            if running.pid != os.getpid():
                raise RuntimeError(
                    f"the {self.name} lock backend was used before this process forked: "
                    "its connections are the parent's; make a backend in this process"
                )
            if threading.get_ident() == running.thread.ident:
                raise RuntimeError(
                    f"a sync {self.name} lock backend called from its own event loop's "
                    "thread would wait for itself: use the async backend there"
                )
            return running.loop

    def _start(self) -> _Running:
        ready = threading.Event()
        made: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

        async def serve() -> None:
            stop = asyncio.Event()
            made.append((asyncio.get_running_loop(), stop))
            ready.set()
            await stop.wait()

        def main() -> None:
            # The Runner cancels what is left, closes async generators and the loop.
            with asyncio.Runner() as runner:
                runner.run(serve())

        thread = threading.Thread(target=main, name=f"headway-{self.name}", daemon=True)
        thread.start()
        ready.wait()
        loop, stop = made[0]
        return _Running(loop, stop, thread, os.getpid())

    def run(
        self,
        coroutine: Coroutine[Any, Any, T],
        undo: Callable[[T], Coroutine[Any, Any, object]] | None = None,
    ) -> T:
        """Run ``coroutine`` on the loop and return its result, or raise its error.

        If this thread is interrupted meanwhile, the coroutine is cancelled and waited
        for; a result it still returned is given to ``undo`` (run to its end), and the
        interruption goes on.

        Args:
            coroutine: What to run.
            undo: Reverses a result whose caller was interrupted; default None.
        """
        try:
            loop = self._started()
        except BaseException:
            coroutine.close()
            raise
        return _wait(loop, coroutine, self.name, undo)

    def close(self, last: Coroutine[Any, Any, object]) -> None:
        """Run ``last`` on the loop (its errors pass), then stop the loop and its thread.

        Closing again, or in a forked child, or before the loop started, only closes
        ``last`` unrun: nothing was opened in this process.

        Args:
            last: The async backend's closing (``aclose()``).
        """
        with self._guard:
            running, self._closed = self._running, True
            ours = running is not None and running.pid == os.getpid() and not running.stopped
            if running is not None and ours:
                running.stopped = True
        if running is None or not ours:
            last.close()
            return
        try:
            _wait(running.loop, last, self.name)
        finally:
            running.loop.call_soon_threadsafe(running.stop.set)
            running.thread.join()


def _wait(
    loop: asyncio.AbstractEventLoop,
    coroutine: Coroutine[Any, Any, T],
    backend: str,
    undo: Callable[[T], Coroutine[Any, Any, object]] | None = None,
) -> T:
    """Run ``coroutine`` on ``loop`` (another thread's) and wait: ``PrivateLoop.run``."""
    call = _Call(coroutine, backend)
    try:
        loop.call_soon_threadsafe(call.start)
        call.done.wait()
    except BaseException:
        # Interrupted: stop the call and wait until it has ended, so it leaves nothing.
        loop.call_soon_threadsafe(call.cancel)
        call.done.wait()
        if call.returned and undo is not None:
            _wait(loop, undo(call.result), backend)  # type: ignore[arg-type]
        raise
    return call.outcome()


@dataclass
class _Running:
    """A started loop: its stop signal, its thread, and the process that started it."""

    loop: asyncio.AbstractEventLoop
    stop: asyncio.Event
    thread: threading.Thread
    pid: int
    stopped: bool = False


class BlockingLockBackend:
    """A ``SyncLockBackend`` that runs an async ``LockBackend`` on a private event loop.

    See the module doc for what that takes. ``close()`` closes the async backend
    (its ``aclose()``, if it has one) and stops the loop.

    Args:
        backend: The async backend, made for this twin alone and not used elsewhere
            (its clients must first connect on the twin's loop).
        loop: The loop to run on; default None: a new one, started on first use.
    """

    def __init__(self, backend: LockBackend, *, loop: PrivateLoop | None = None) -> None:
        self.backend = backend
        self.name = backend.name
        self._owns_loop = loop is None
        self._loop = loop if loop is not None else PrivateLoop(backend.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.backend!r})"

    def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """As the async backend's ``acquire``, blocking (see ``LockBackend.acquire``).

        Args:
            resource: The lock's name.
            ttl: The lease length in seconds.
            timeout: How long to wait, in seconds (0: one attempt).
        """
        return self._loop.run(self.backend.acquire(resource, ttl, timeout), self._forget)

    async def _forget(self, lease: Lease) -> None:
        # A lease granted as its caller was interrupted: nobody will release it.
        try:
            await self.backend.release(lease)
        except Exception:  # lapsed or unreachable: nothing more to undo
            return

    def release(self, lease: Lease) -> None:
        """As the async backend's ``release``, blocking (see ``LockBackend.release``).

        Args:
            lease: The lease to release.
        """
        self._loop.run(self.backend.release(lease))

    def extend(self, lease: Lease, ttl: float) -> Lease:
        """As the async backend's ``extend``, blocking (see ``LockBackend.extend``).

        Args:
            lease: The lease to renew.
            ttl: The new length in seconds, from now.
        """
        return self._loop.run(self.backend.extend(lease, ttl))

    def inspect(self, resource: str) -> LockState:
        """As the async backend's ``inspect``, blocking (see ``InspectableLockBackend``).

        Args:
            resource: The lock's name.

        Raises:
            TypeError: The async backend cannot tell who holds a lock.
        """
        inspect: Callable[[str], Coroutine[Any, Any, LockState]] | None = getattr(
            self.backend, "inspect", None
        )
        if inspect is None:
            raise TypeError(f"the {self.name} lock backend cannot tell who holds a lock")
        return self._loop.run(inspect(resource))

    async def _aclose(self) -> None:
        """Close the async backend (a subclass adds what it made: an engine...)."""
        aclose: Callable[[], Awaitable[object]] | None = getattr(self.backend, "aclose", None)
        if aclose is not None:
            await aclose()

    def close(self) -> None:
        """Close the async backend (leases still held end or run out) and stop the loop.

        A view made by ``for_mode`` shares its parent's loop: closing the parent ends it.
        """
        if self._owns_loop:
            self._loop.close(self._aclose())


class BlockingModalLockBackend(BlockingLockBackend):
    """A ``SyncModalLockBackend`` over an async ``ModalLockBackend``, on a private loop.

    Args:
        backend: The async backend, made for this twin alone (as for
            ``BlockingLockBackend``).
        loop: The loop to run on; default None: a new one, started on first use.
    """

    backend: ModalLockBackend

    def __init__(self, backend: ModalLockBackend, *, loop: PrivateLoop | None = None) -> None:
        super().__init__(backend, loop=loop)
        self.modes: frozenset[ModeKind] = backend.modes

    def for_mode(self, mode: LockMode) -> SyncLockBackend:
        """The async backend's ``for_mode`` view, on this backend's loop.

        Args:
            mode: The mode; its kind is one of ``modes``.
        """
        return BlockingLockBackend(self.backend.for_mode(mode), loop=self._loop)
