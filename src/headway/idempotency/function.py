"""``idempotent_function``: run a function once per key, and return the stored result after.

The same records, lock, fencing and lease renewal as ``IdempotencyMiddleware``, for
code that is not HTTP (queue consumers, webhook processors, jobs). A call reads the
record; a completed one is replayed. Otherwise it takes the key's lock (or waits for
it, with ``on_conflict="wait"``), claims the record under the lease's fencing token,
runs the body while both leases are renewed, and stores the serialized result with a
fenced write. Async functions run all of it on the caller's loop; sync ones run the
body in the caller's thread and the records on headway's background loop (``portal``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, cast

from headway._errors import (
    BackendUnavailable,
    IdempotencyError,
    IdempotencyInProgress,
    IdempotencyKeyReused,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    ResultNotSerializable,
)
from headway.idempotency.arguments import CallIdentity
from headway.idempotency.callers import scope_id
from headway.idempotency.events import IdempotencyEvent, IdempotencyEventKind, IdempotencyHook
from headway.idempotency.portal import submit
from headway.idempotency.record import ClaimOutcome, Record, StoredResponse
from headway.idempotency.renewal import RequestLeases
from headway.idempotency.serializers import JsonSerializer, Serializer, dump_error, load_error
from headway.idempotency.store import RecordStore
from headway.idempotency.table import Status
from headway.lock.backends.memory import MemoryLockBackend
from headway.lock.contract import LockBackend
from headway.lock.driver import complete
from headway.lock.lease import Lease, check_timeout, check_ttl
from headway.lock.lock import Lock

__all__ = ["IdempotentDecorator", "idempotent_function"]

log = logging.getLogger("headway.idempotency")

P = ParamSpec("P")
R = TypeVar("R")

#: ``response_status`` of a record holding a result, and of one holding a stored error.
RESULT, ERROR = 200, 500
_PENDING: Any = object()  # a record still in flight: nothing to answer from


class IdempotentDecorator(Protocol):
    """What ``idempotent_function(...)`` returns: keeps the decorated signature."""

    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R]: ...


def idempotent_function(
    *,
    store: RecordStore | None = None,
    lock_backend: LockBackend | None = None,
    key: Callable[..., str] | None = None,
    namespace: str | None = None,
    ignore: Collection[str] = (),
    ttl: float | None = None,
    lease_ttl: float = 30.0,
    on_conflict: Literal["raise", "wait"] = "raise",
    wait_timeout: float = 10.0,
    serializer: Serializer | None = None,
    store_errors: tuple[type[Exception], ...] = (),
    on_event: IdempotencyHook | None = None,
) -> IdempotentDecorator:
    """Run the decorated function (async or sync) once per key; later calls get its result.

    The key is a hash of the bound arguments (less those named in ``ignore``), or
    what ``key(*args, **kwargs)`` returns; the same key with different arguments
    raises ``IdempotencyKeyReused``. Keys are scoped by ``namespace`` (default: the
    function's module and qualified name). Results are kept ``ttl`` s (default: the
    store's) as ``serializer`` (default JSON) writes them; every caller, the first
    included, gets ``loads(dumps(result))``. A result it cannot store raises
    ``ResultNotSerializable``. An exception releases the key (a retry runs again),
    unless it is an instance of ``store_errors``: then it is stored and replayed.
    A call while the key runs elsewhere raises ``IdempotencyInProgress``, or with
    ``on_conflict="wait"`` waits up to ``wait_timeout`` s for its result. ``store`` and
    ``lock_backend`` default to a SQLite file and the in-memory lock (one process).
    """
    if on_conflict not in ("raise", "wait"):
        raise ValueError(f'on_conflict must be "raise" or "wait", got {on_conflict!r}')
    check_ttl(lease_ttl)
    check_timeout(wait_timeout)
    if ttl is not None:
        check_ttl(ttl)
    if not all(isinstance(c, type) and issubclass(c, Exception) for c in store_errors):
        raise TypeError("store_errors must be a tuple of Exception subclasses")
    records = store or RecordStore.from_url("sqlite+aiosqlite:///headway.sqlite3")
    if ttl is not None:
        records = _with_ttl(records, ttl)

    def decorate(fn: Callable[P, R], /) -> Callable[P, R]:
        runner = _Runner(
            namespace or f"{fn.__module__}.{fn.__qualname__}", records,
            lock_backend or MemoryLockBackend(), lease_ttl,
            wait_timeout if on_conflict == "wait" else 0.0,
            serializer or JsonSerializer(), store_errors, on_event,
        )  # fmt: skip
        return _wrap(fn, runner, CallIdentity(fn, key, ignore))

    return decorate


def _wrap(fn: Callable[P, R], runner: _Runner, identity: CallIdentity) -> Callable[P, R]:
    """``fn`` made idempotent: an async wrapper for a coroutine function, else a sync one."""
    if inspect.iscoroutinefunction(fn):
        body = cast(Callable[..., Awaitable[Any]], fn)

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            key, fingerprint = identity(args, kwargs)
            return await runner.execute(key, fingerprint, lambda: body(*args, **kwargs))

        return cast(Callable[P, R], run_async)

    @functools.wraps(fn)
    def run_sync(*args: Any, **kwargs: Any) -> Any:
        key, fingerprint = identity(args, kwargs)
        return runner.execute_sync(key, fingerprint, lambda: fn(*args, **kwargs))

    return cast(Callable[P, R], run_sync)


def _with_ttl(store: RecordStore, ttl: float) -> RecordStore:
    """A store on the same engine (and pool) whose records are kept ``ttl`` s."""
    view = RecordStore(store.engine, ttl=ttl, timeout=store.timeout)
    view._create = store._create  # an embedded store still creates its table on first use
    return view


class _Runner:
    """One idempotent function's calls: its records, its lock, its options."""

    def __init__(
        self,
        namespace: str,
        store: RecordStore,
        lock_backend: LockBackend,
        lease_ttl: float,
        wait: float,
        serializer: Serializer,
        store_errors: tuple[type[Exception], ...],
        on_event: IdempotencyHook | None,
    ) -> None:
        if not namespace:
            raise ValueError("namespace must not be empty")
        self.namespace = namespace
        # Prefixed, so a function's records never share a scope with an HTTP caller's.
        self.scope = scope_id(f"function:{namespace}")
        self.store = store
        self.lock_backend = lock_backend
        self.lease_ttl = lease_ttl
        self.wait = wait
        self.serializer = serializer
        self.store_errors = store_errors
        self.on_event = on_event

    def execute_sync(self, key: str, fingerprint: str, body: Callable[[], Any]) -> Any:
        """``execute`` for a sync body: the body runs here, the records on the portal."""
        go: concurrent.futures.Future[None] = concurrent.futures.Future()
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        async def signal() -> Any:  # on the portal, once the record is claimed
            go.set_result(None)
            return await asyncio.wrap_future(done)

        outcome = submit(self.execute(key, fingerprint, signal))
        concurrent.futures.wait([go, outcome], return_when=concurrent.futures.FIRST_COMPLETED)
        if go.done():
            try:
                value = body()
            except Exception as exc:
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    done.set_exception(exc)  # unless a lost lease cancelled the call already
            except BaseException:
                done.cancel()  # KeyboardInterrupt and kin: the record is released, then re-raised
                raise
            else:
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    done.set_result(value)
        return outcome.result()

    async def execute(self, key: str, fingerprint: str, body: Callable[[], Awaitable[Any]]) -> Any:
        """Replay the key's stored result, or claim it and run ``body`` once."""
        record = await self.store.get(self.scope, key)
        if record is not None:
            answer = await self._answer(record, key, fingerprint)
            if answer is not _PENDING:
                return answer
        lock = Lock(self.lock_backend, self._resource(key), ttl=self.lease_ttl, timeout=self.wait)
        try:
            lease = await lock.acquire()
        except LockNotAcquired:
            raise await self._in_progress(key) from None
        try:
            return await self._claim_and_run(key, fingerprint, lock, lease, body)
        finally:
            await _release_lock(lock, lease)

    def _resource(self, key: str) -> str:
        return f"idempotency/{self.scope}/{key}"

    async def _claim_and_run(
        self,
        key: str,
        fingerprint: str,
        lock: Lock,
        lease: Lease,
        body: Callable[[], Awaitable[Any]],
    ) -> Any:
        sent = time.monotonic()
        claim = await self.store.claim(
            self.scope, key, fingerprint,
            fence=lease.fence, lease_token=lease.token, lease_ttl=self.lease_ttl,
        )  # fmt: skip
        if claim.outcome is not ClaimOutcome.CLAIMED:
            if claim.record is not None:
                answer = await self._answer(claim.record, key, fingerprint)
                if answer is not _PENDING:
                    return answer
            raise await self._in_progress(key)
        assert claim.fence is not None
        await self._emit("claimed", key, claim.fence)
        ttl = self.lease_ttl
        record = Lease(lease.resource, lease.token, claim.fence, sent + ttl, ttl)
        leases = RequestLeases(self.store, self.scope, key, record, (lock, lease))
        async with leases.watchdog(ttl):
            return await self._run(key, claim.fence, body)

    async def _run(self, key: str, fence: int, body: Callable[[], Awaitable[Any]]) -> Any:
        """Run the body on our claimed record; store its result (fenced) or release the record."""
        try:
            value = await body()
        except BaseException as exc:
            if isinstance(exc, self.store_errors):
                await self._complete(key, fence, StoredResponse(ERROR, (), dump_error(exc)))
            else:
                await self._release(key, fence)
            raise
        try:
            data = self.serializer.dumps(value)
            returned = self.serializer.loads(data)
        except Exception as exc:
            await self._release(key, fence)
            raise ResultNotSerializable(
                f"{self.namespace}: cannot store the result ({exc}); it was not stored and the "
                "key is free again. Return data the serializer holds, or pass serializer=.",
                namespace=self.namespace, key=key,
            ) from exc  # fmt: skip
        await self._complete(key, fence, StoredResponse(RESULT, (), data))
        return returned

    async def _complete(self, key: str, fence: int, stored: StoredResponse) -> None:
        if not await self.store.complete(self.scope, key, fence, stored):
            # A newer lease took the record over: this call's outcome must not count.
            raise LockLost(
                f"fence {fence} was superseded; the result was not stored",
                resource=self._resource(key),
            )
        await self._emit("completed", key, fence)

    async def _release(self, key: str, fence: int) -> None:
        try:
            await complete(self.store.release(self.scope, key, fence))
        except Exception as exc:  # the body's error matters more; the record's lease runs out
            log.warning("could not release an idempotency record: %s", exc)
            return
        await self._emit("released", key, fence)

    async def _answer(self, record: Record, key: str, fingerprint: str) -> Any:
        """The stored result (or stored error, raised); ``_PENDING`` if still in flight."""
        if record.fingerprint != fingerprint:
            await self._emit("key_reused", key)
            raise IdempotencyKeyReused(
                f"{self.namespace}: key {key!r} was used before with different arguments",
                namespace=self.namespace, key=key,
            )  # fmt: skip
        if record.status is not Status.COMPLETED or record.response is None:
            return _PENDING
        await self._emit("replayed", key, record.fence)
        response = record.response
        assert response.body is not None
        if response.status == RESULT:
            return self.serializer.loads(response.body)
        error = load_error(response.body, self.store_errors)
        if error is None:
            raise IdempotencyError(
                f"{self.namespace}: key {key!r} stored an error this function no longer "
                "stores (store_errors changed?)",
                namespace=self.namespace, key=key,
            )  # fmt: skip
        raise error

    async def _in_progress(self, key: str) -> IdempotencyInProgress:
        await self._emit("conflict", key)
        waited = f" (waited {self.wait:g} s)" if self.wait else ""
        return IdempotencyInProgress(
            f"{self.namespace}: key {key!r} is running elsewhere{waited}; retry later",
            namespace=self.namespace, key=key,
        )  # fmt: skip

    async def _emit(self, kind: IdempotencyEventKind, key: str, fence: int | None = None) -> None:
        if self.on_event is None:
            return
        try:
            result = self.on_event(IdempotencyEvent(kind, self.namespace, key, "function", fence))
            if inspect.isawaitable(result):
                await result
        except Exception:  # metrics must never change what the caller gets
            log.exception("the idempotency on_event hook raised")


async def _release_lock(lock: Lock, lease: Lease) -> None:
    """Release the call's lock; a lapsed or unreachable lock expires by its TTL."""
    try:
        await lock.release(lease)  # shielded from cancellation by the lock
    except (LockNotOwned, BackendUnavailable) as exc:
        log.warning("releasing %r failed; it expires by its TTL: %s", lease.resource, exc)
