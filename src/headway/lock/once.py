"""``run_once``: a scheduled job that runs on one instance of a fleet per call window.

ShedLock's semantics over any lock backend. Every instance's scheduler calls the
decorated function at the same moments; each call tries the lock once (no wait):

- **granted**: the body runs, under a lease of ``at_most_for`` seconds that is not
  renewed (a hard cap, as ShedLock's ``lockAtMostFor``). If the runner dies, the lease
  runs out after ``at_most_for`` and the next window's call may run. An async body
  still running at the lease's deadline is cancelled and the call raises ``LockLost``;
  a sync one cannot be interrupted, so the call raises ``LockLost`` when it returns.
- **refused**: another instance runs the job, or ran it less than ``at_least_for``
  ago: the call returns ``Skipped`` and never raises.

After the body (returned, raised or cancelled) the lease is not released but shortened
to end ``at_least_for`` after it was asked for (one ``extend``), and released then by
this process (a task or a timer): no other instance runs the job sooner, even if the
body took no time and the instances' clocks or schedules differ by up to that much. The
time is counted on the lease's own monotonic deadline (the backend keeps the lease for
its ``ttl`` on its own clock), never on a wall clock. An ``at_least_for`` already spent
releases the lease at once.

A backend whose leases end with their session (PostgreSQL, MySQL) would free a dead
runner's window at once; it offers ``WindowClaimBackend`` instead, and ``run_once``
then claims the window in the store (``claim_window``: a "locked until" row, on the
store's clock) and ends the claim after the body (``end_window``: held until
``at_least_for`` after the claim), with nothing held in between: ShedLock's JDBC
provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar, cast, overload

from headway._clock import Clock, MonotonicClock
from headway._errors import BackendUnavailable, LockLost, LockNotAcquired, LockNotOwned
from headway.lock.capabilities import SyncWindowClaimBackend, WindowClaimBackend
from headway.lock.contract import LockBackend, SyncLockBackend
from headway.lock.lease import Lease, _finite_seconds, check_ttl

__all__ = ["RunOnceDecorator", "Skipped", "run_once"]

log = logging.getLogger("headway.lock")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Skipped:
    """What a ``run_once`` function returns from a call that did not run the body.

    Another instance holds the job's lock: it runs the job now, or ran it less than
    ``at_least_for`` seconds ago. Test for it with ``isinstance(result, Skipped)``.

    Attributes:
        name: The job's name (its lock's resource).
    """

    name: str


class RunOnceDecorator(Protocol):
    """What ``run_once(...)`` returns: a decorator keeping the signature, whose function
    returns ``Skipped`` instead of running when another instance has the window."""

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Callable[P, Coroutine[Any, Any, R | Skipped]]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R | Skipped]: ...


def run_once(
    backend: LockBackend | SyncLockBackend,
    name: str,
    *,
    at_most_for: float,
    at_least_for: float = 0.0,
    clock: Clock | None = None,
) -> RunOnceDecorator:
    """Run the decorated function on one instance per call window; skip it on the others.

    Every instance calls the function at the same scheduled moments (cron, APScheduler,
    Celery beat, a loop); the first call of a window takes the lock ``name`` and runs
    the body, the others return ``Skipped(name)`` at once. An async function needs an
    async backend; a sync function a sync one (``SyncRedisLockBackend``).

    Args:
        backend: The lock backend the instances share; a ``LockBackend`` for an async
            function, a ``SyncLockBackend`` for a sync one.
        name: The job's name: the lock's resource, the same on every instance.
        at_most_for: Seconds the lock is held at most (> 0, >= ``at_least_for``): the
            lease's TTL, not renewed. If the runner dies, another instance may run the
            job after it; an async body still running then is cancelled (``LockLost``).
            Make it well above the body's longest run.
        at_least_for: Seconds the lock is held at least, counted from the call (>= 0);
            default 0.0: released when the body ends. Make it longer than the spread of
            the instances' calls of one window (clock skew, scheduler jitter) and
            shorter than the period between windows.
        clock: The monotonic clock the backend's lease deadlines count in; default
            None: ``time.monotonic`` (give a ``MemoryLockBackend``'s ``FakeClock``).

    Raises:
        TypeError: ``name`` is not a str, seconds of the wrong type, or (when
            decorating) an async function over a sync backend or the reverse.
        ValueError: ``name`` is empty, ``at_most_for`` <= 0, ``at_least_for`` < 0 or
            above ``at_most_for``, or either infinite or over a week.
        LockLost: (a call) The body outlived ``at_most_for``: another instance may have
            run the job meanwhile.
        BackendUnavailable: (a call) The backend did not answer the acquire: nothing ran.
    """
    once = _Once(backend, name, at_most_for, at_least_for, clock or MonotonicClock())

    def decorate(fn: Callable[..., Any], /) -> Callable[..., Any]:
        is_async_backend = inspect.iscoroutinefunction(backend.acquire)
        if inspect.iscoroutinefunction(fn):
            if not is_async_backend:
                raise TypeError(f"run_once: async {fn.__qualname__} needs an async LockBackend")
            body = cast(Callable[..., Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await once.run(lambda: body(*args, **kwargs))

            return run_async
        if is_async_backend:
            raise TypeError(
                f"run_once: sync {getattr(fn, '__qualname__', fn)!r} needs a SyncLockBackend"
            )

        @functools.wraps(fn)
        def run_sync(*args: Any, **kwargs: Any) -> Any:
            return once.run_sync(lambda: fn(*args, **kwargs))

        return run_sync

    return cast(RunOnceDecorator, decorate)


class _Once:
    """One job's lock: try it, run the body, keep the lease ``at_least_for``."""

    def __init__(
        self,
        backend: LockBackend | SyncLockBackend,
        name: str,
        at_most_for: float,
        at_least_for: float,
        clock: Clock,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if not name:
            raise ValueError("name must not be empty")
        check_ttl(at_most_for)
        least = _finite_seconds("at_least_for", at_least_for)
        if not 0 <= least <= at_most_for:
            raise ValueError(
                f"at_least_for must be >= 0 and <= at_most_for ({at_most_for:g} s), "
                f"got {at_least_for!r}"
            )
        self.backend = backend
        self.name = name
        self.at_most_for = float(at_most_for)
        self.at_least_for = least
        self.clock = clock
        #: Whether the backend claims windows in its store (``WindowClaimBackend``).
        self.claims = isinstance(backend, WindowClaimBackend | SyncWindowClaimBackend)
        #: Releases waiting for ``at_least_for`` to pass (kept so they are not collected).
        self._pending: set[asyncio.Task[None]] = set()

    def _keep_for(self, lease: Lease) -> float:
        """Seconds left until ``at_least_for`` after the lease was asked for."""
        return lease.deadline - lease.ttl + self.at_least_for - self.clock()

    async def run(self, call: Callable[[], Awaitable[R]]) -> R | Skipped:
        backend = cast(LockBackend, self.backend)
        lease = await self._take(backend)
        if lease is None:
            log.debug("job %r skipped: another instance has this window", self.name)
            return Skipped(self.name)
        try:
            async with asyncio.timeout(max(0.0, lease.deadline - self.clock())) as cap:
                return await call()
        except TimeoutError as exc:
            if cap.expired():
                raise self._overran() from exc
            raise
        finally:
            if self.claims:
                await self._end_claim(cast(WindowClaimBackend, backend), lease)
            else:
                await self._keep(backend, lease)

    async def _take(self, backend: LockBackend) -> Lease | None:
        if self.claims:
            return await cast(WindowClaimBackend, backend).claim_window(self.name, self.at_most_for)
        try:
            return await backend.acquire(self.name, self.at_most_for, 0)
        except LockNotAcquired:
            return None

    async def _end_claim(self, backend: WindowClaimBackend, lease: Lease) -> None:
        try:
            held = await backend.end_window(lease, self.at_least_for)
        except BackendUnavailable as exc:  # the window is kept longer: till at_most_for
            log.warning("job %r: ending its window failed: %s", self.name, exc)
            return
        if not held:
            log.warning("job %r: its window ran out before the body ended", self.name)

    async def _keep(self, backend: LockBackend, lease: Lease) -> None:
        keep = self._keep_for(lease)
        if keep > 0.001:
            try:
                lease = await backend.extend(lease, keep)
            except LockNotOwned:
                log.warning("job %r: lease lost before at_least_for ended", self.name)
                return
            except BackendUnavailable as exc:  # the lease is kept longer: till at_most_for
                log.warning("job %r: shortening its lease failed: %s", self.name, exc)
            task = asyncio.get_running_loop().create_task(self._release_at(backend, lease))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return
        with contextlib.suppress(LockNotOwned):  # lapsed: the overrun is reported already
            try:
                await backend.release(lease)
            except BackendUnavailable as exc:
                log.warning("job %r: release failed; it expires by its TTL: %s", self.name, exc)

    async def _release_at(self, backend: LockBackend, lease: Lease) -> None:
        await asyncio.sleep(max(0.0, lease.deadline - self.clock()))
        with contextlib.suppress(LockNotOwned, BackendUnavailable):  # it expires anyway
            await backend.release(lease)

    def run_sync(self, call: Callable[[], R]) -> R | Skipped:
        backend = cast(SyncLockBackend, self.backend)
        lease = self._take_sync(backend)
        if lease is None:
            log.debug("job %r skipped: another instance has this window", self.name)
            return Skipped(self.name)
        try:
            result = call()
        finally:
            overran = self.clock() >= lease.deadline
            if self.claims:
                self._end_claim_sync(cast(SyncWindowClaimBackend, backend), lease)
            else:
                self._keep_sync(backend, lease)
        if overran:
            raise self._overran()
        return result

    def _take_sync(self, backend: SyncLockBackend) -> Lease | None:
        if self.claims:
            claims = cast(SyncWindowClaimBackend, backend)
            return claims.claim_window(self.name, self.at_most_for)
        try:
            return backend.acquire(self.name, self.at_most_for, 0)
        except LockNotAcquired:
            return None

    def _end_claim_sync(self, backend: SyncWindowClaimBackend, lease: Lease) -> None:
        try:
            held = backend.end_window(lease, self.at_least_for)
        except BackendUnavailable as exc:
            log.warning("job %r: ending its window failed: %s", self.name, exc)
            return
        if not held:
            log.warning("job %r: its window ran out before the body ended", self.name)

    def _keep_sync(self, backend: SyncLockBackend, lease: Lease) -> None:
        keep = self._keep_for(lease)
        if keep > 0.001:
            try:
                lease = backend.extend(lease, keep)
            except LockNotOwned:
                log.warning("job %r: lease lost before at_least_for ended", self.name)
                return
            except BackendUnavailable as exc:
                log.warning("job %r: shortening its lease failed: %s", self.name, exc)
            timer = threading.Timer(
                max(0.0, lease.deadline - self.clock()), self._release_sync, (backend, lease)
            )
            timer.daemon = True  # a process that exits leaves the lease to its TTL
            timer.start()
            return
        with contextlib.suppress(LockNotOwned):
            try:
                backend.release(lease)
            except BackendUnavailable as exc:
                log.warning("job %r: release failed; it expires by its TTL: %s", self.name, exc)

    @staticmethod
    def _release_sync(backend: SyncLockBackend, lease: Lease) -> None:
        with contextlib.suppress(LockNotOwned, BackendUnavailable):
            backend.release(lease)

    def _overran(self) -> LockLost:
        return LockLost(
            f"job {self.name!r} ran past at_most_for ({self.at_most_for:g} s): another "
            "instance may have run it meanwhile",
            resource=self.name,
        )
