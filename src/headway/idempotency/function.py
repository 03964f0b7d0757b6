"""``idempotent_function``: run a function once per key, and return the stored result after.

The function face of the idempotency engine (``engine``) that ``IdempotencyMiddleware``
is the HTTP face of: the same records, lock, fencing and lease renewal, for code that is
not HTTP (queue consumers, webhook processors, jobs). A call reads the record; a
completed one is replayed. Otherwise it claims the record (the lock requested alongside,
or first with ``on_conflict="wait"``: the lock is what it waits on), runs the body while
both leases are renewed, and stores the serialized result with a fenced write. Async
functions run all of it on the caller's loop; sync ones run the body in the caller's
thread and the records on headway's background loop (``portal``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, cast

from headway._errors import (
    IdempotencyError,
    IdempotencyInProgress,
    IdempotencyKeyReused,
    ResultNotSerializable,
)
from headway.idempotency.arguments import CallIdentity
from headway.idempotency.callers import caller_id
from headway.idempotency.contract import RecordBackend
from headway.idempotency.engine import Call, Engine, Found
from headway.idempotency.events import IdempotencyHook
from headway.idempotency.portal import submit
from headway.idempotency.record import StoredResponse
from headway.idempotency.serializers import JsonSerializer, Serializer, dump_error, load_error
from headway.idempotency.store import RecordStore
from headway.lock.backends.memory import MemoryLockBackend
from headway.lock.contract import LockBackend
from headway.lock.lease import check_timeout, check_ttl

__all__ = ["IdempotentDecorator", "idempotent_function"]

log = logging.getLogger("headway.idempotency")

P = ParamSpec("P")
R = TypeVar("R")

#: ``response_status`` of a record holding a result, and of one holding a stored error.
RESULT, ERROR = 200, 500


class IdempotentDecorator(Protocol):
    """What ``idempotent_function(...)`` returns: a decorator keeping the signature."""

    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R]: ...


def idempotent_function(
    *,
    store: RecordBackend | None = None,
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

    Every caller, the first included, gets ``loads(dumps(result))``. An exception
    releases the key (a retry runs again), unless it is an instance of
    ``store_errors``: then it is stored and replayed.

    Args:
        store: Where the records live; default None: a SQLite file
            (``headway.sqlite3``), one process.
        lock_backend: The lock taken beside each claim; default None: a
            ``MemoryLockBackend``, one process.
        key: A function of the call's arguments returning its key; default None: a
            hash of the bound arguments (less those named in ``ignore``).
        namespace: Scopes the keys; default None: the function's module and
            qualified name.
        ignore: Names of arguments left out of the key and of the comparison of a
            retry's arguments; default none.
        ttl: Seconds a result is kept; default None: the store's. Only a
            ``RecordStore`` takes it; a ``RecordBackend`` of your own keeps its own.
        lease_ttl: The running call's lease in seconds, renewed while it runs;
            default 30.0.
        on_conflict: A call while the key runs elsewhere: ``"raise"`` (default)
            ``IdempotencyInProgress``, or ``"wait"`` up to ``wait_timeout`` for its
            result.
        wait_timeout: How long ``on_conflict="wait"`` waits, in seconds; default 10.0.
        serializer: Writes and reads the results (``Serializer``); default None:
            ``JsonSerializer()``.
        store_errors: Exception classes stored and replayed like results; default
            none: an exception releases the key.
        on_event: An ``IdempotencyHook`` told of each outcome (``IdempotencyEvent``,
            ``source="function"``); default None.

    Raises:
        ValueError: A bad ``on_conflict``, ``ttl``, ``lease_ttl`` or ``wait_timeout``
            (when ``idempotent_function`` is called).
        TypeError: ``store_errors`` holds something that is not an Exception class.
        IdempotencyKeyReused: (a call) The key was used before with other arguments.
        IdempotencyInProgress: (a call) The key runs elsewhere (or the wait ran out).
        ResultNotSerializable: (a call) The serializer cannot store the result.
        BackendUnavailable: (a call) The store or the lock backend did not answer.
        LockLost: (a call) The call's lease was lost, or a newer claim took the record
            over and the result was not stored.
    """
    _check_options(on_conflict, ttl, lease_ttl, wait_timeout, store_errors)
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


def _check_options(
    on_conflict: str,
    ttl: float | None,
    lease_ttl: float,
    wait_timeout: float,
    store_errors: tuple[type[Exception], ...],
) -> None:
    """``ValueError`` or ``TypeError`` for an option ``idempotent_function`` cannot use,
    raised when it is called, before any store is opened."""
    if on_conflict not in ("raise", "wait"):
        raise ValueError(f'on_conflict must be "raise" or "wait", got {on_conflict!r}')
    check_ttl(lease_ttl)
    check_timeout(wait_timeout)
    if ttl is not None:
        check_ttl(ttl)
    if not all(isinstance(c, type) and issubclass(c, Exception) for c in store_errors):
        raise TypeError("store_errors must be a tuple of Exception subclasses")


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


def _with_ttl(store: RecordBackend, ttl: float) -> RecordStore:
    """A store on the same engine (and pool) whose records are kept ``ttl`` s."""
    if not isinstance(store, RecordStore):  # how long records are kept is a store's own
        raise TypeError("ttl= needs a RecordStore: give your own store its ttl instead")
    view = RecordStore(store.engine, ttl=ttl, timeout=store.timeout)
    view._create = store._create  # an embedded store still creates its table on first use
    return view


class _Runner:
    """One idempotent function's calls: the function face of the idempotency engine."""

    def __init__(
        self,
        namespace: str,
        store: RecordBackend,
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
        # Prefixed, so a function's records never share a caller id with an HTTP caller's.
        self.caller = caller_id(f"function:{namespace}")
        self.engine = Engine(
            store=store, lock_backend=lock_backend, source="function",
            lease_ttl=lease_ttl, wait=wait, on_event=on_event,
        )  # fmt: skip
        self.serializer = serializer
        self.store_errors = store_errors

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
        run = _BodyRun(self, key, body)
        answer = await self.engine.execute(
            Call(self.caller, key, fingerprint, label=self.namespace), run
        )
        if answer is None:
            return run.outcome()
        if answer.found is Found.REPLAY:
            assert answer.response is not None
            return self._replay(key, answer.response)
        if answer.found is Found.REUSED:
            raise IdempotencyKeyReused(
                f"{self.namespace}: key {key!r} was used before with different arguments",
                namespace=self.namespace, key=key,
            )  # fmt: skip
        wait = self.engine.wait
        waited = f" (waited {wait:g} s)" if wait else ""
        raise IdempotencyInProgress(
            f"{self.namespace}: key {key!r} is running elsewhere{waited}; retry later",
            namespace=self.namespace, key=key,
        )  # fmt: skip

    def _replay(self, key: str, response: StoredResponse) -> Any:
        """The stored result, or the stored error raised."""
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


class _BodyRun:
    """The engine's work for one call: run the body and serialize its result (``Work``)."""

    __slots__ = ("body", "error", "key", "runner", "value")

    def __init__(self, runner: _Runner, key: str, body: Callable[[], Awaitable[Any]]) -> None:
        self.runner = runner
        self.key = key
        self.body = body
        self.value: Any = None
        self.error: Exception | None = None  # an error of ``store_errors``, stored

    async def run(self) -> StoredResponse:
        """The body's result (or error of ``store_errors``) as the record keeps it."""
        runner = self.runner
        try:
            value = await self.body()
        except runner.store_errors as exc:
            self.error = exc
            return StoredResponse(ERROR, (), dump_error(exc))
        try:
            data = runner.serializer.dumps(value)
            self.value = runner.serializer.loads(data)
        except Exception as exc:
            raise ResultNotSerializable(
                f"{runner.namespace}: cannot store the result ({exc}); it was not stored and "
                "the key is free again. Return data the serializer holds, or pass serializer=.",
                namespace=runner.namespace, key=self.key,
            ) from exc  # fmt: skip
        return StoredResponse(RESULT, (), data)

    async def finish(self) -> None:
        """Nothing to end: the caller gets ``outcome()``."""

    def outcome(self) -> Any:
        """What the first call returns (or raises), once its record is settled."""
        if self.error is not None:
            raise self.error
        return self.value
