"""``locked``: run a function under ``hold()`` on a lock named from its arguments.

An async function is held with a ``Lock`` over a ``LockBackend``, a sync one with a
``SyncLock`` over a ``SyncLockBackend``. The lease of the running call is in a context
variable: ``current_lease()`` gives it to the body (its fence, for fenced writes)
without a parameter the callers would have to pass. A call's lock name is made by
``call_names.CallNaming``.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, Never, ParamSpec, Protocol, TypeVar, cast, overload

from headway._errors import LockNotAcquired
from headway.lock.call_names import CallNaming, Name
from headway.lock.contract import (
    LockBackend,
    ModalLockBackend,
    SyncLockBackend,
    SyncModalLockBackend,
)
from headway.lock.lease import Lease, check_timeout, check_ttl
from headway.lock.lock import Lock, _check_hold
from headway.lock.modes import READ, WRITE
from headway.lock.shared import _require
from headway.lock.sync_lock import SyncLock

__all__ = ["LockDecorator", "SyncLockDecorator", "current_lease", "locked"]

P = ParamSpec("P")
R = TypeVar("R")
S_co = TypeVar("S_co", covariant=True)

#: The running ``locked`` call's current lease, innermost first; None outside any.
_current: contextvars.ContextVar[Callable[[], Lease] | None] = contextvars.ContextVar(
    "headway_current_lease", default=None
)


def current_lease() -> Lease:
    """The lease held for the innermost ``locked`` function running in this context.

    Its ``fence`` is what to give a store that checks fencing tokens; its ``resource``
    is the lock's name as computed from the call's arguments. On an async function the
    lease returned is the latest renewal's.

    Raises:
        LookupError: No ``locked`` function is running in this context (task or thread).
    """
    get = _current.get()
    if get is None:
        raise LookupError("current_lease() called outside a function decorated with locked()")
    return get()


class LockDecorator(Protocol[S_co]):
    """What ``locked(backend, ...)`` returns for an async backend.

    A decorator of coroutine functions keeping their parameters; the result type
    gains ``None`` (``S_co``) when ``on_timeout="skip"``.
    """

    def __call__(
        self, fn: Callable[P, Awaitable[R]], /
    ) -> Callable[P, Coroutine[Any, Any, R | S_co]]: ...


class SyncLockDecorator(Protocol[S_co]):
    """What ``locked(backend, ...)`` returns for a sync backend.

    A decorator of plain functions keeping their parameters; the result type gains
    ``None`` (``S_co``) when ``on_timeout="skip"``.
    """

    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R | S_co]: ...


OnTimeout = Literal["raise", "skip"]
Mode = Literal["read", "write"] | None


@overload
def locked(
    backend: LockBackend,
    name: Name,
    *,
    ttl: float = ...,
    timeout: float = ...,
    on_timeout: Literal["raise"] = ...,
    mode: Mode = ...,
    renew_every: float | None = ...,
    max_hold: float | None = ...,
) -> LockDecorator[Never]: ...
@overload
def locked(
    backend: LockBackend,
    name: Name,
    *,
    ttl: float = ...,
    timeout: float = ...,
    on_timeout: Literal["skip"],
    mode: Mode = ...,
    renew_every: float | None = ...,
    max_hold: float | None = ...,
) -> LockDecorator[None]: ...
@overload
def locked(
    backend: SyncLockBackend,
    name: Name,
    *,
    ttl: float = ...,
    timeout: float = ...,
    on_timeout: Literal["raise"] = ...,
    mode: Mode = ...,
    renew_every: float | None = ...,
    max_hold: None = ...,
) -> SyncLockDecorator[Never]: ...
@overload
def locked(
    backend: SyncLockBackend,
    name: Name,
    *,
    ttl: float = ...,
    timeout: float = ...,
    on_timeout: Literal["skip"],
    mode: Mode = ...,
    renew_every: float | None = ...,
    max_hold: None = ...,
) -> SyncLockDecorator[None]: ...
def locked(
    backend: LockBackend | SyncLockBackend,
    name: Name,
    *,
    ttl: float = 30.0,
    timeout: float = 10.0,
    on_timeout: OnTimeout = "raise",
    mode: Mode = None,
    renew_every: float | None = None,
    max_hold: float | None = None,
) -> LockDecorator[Any] | SyncLockDecorator[Any]:
    """Run each call of the decorated function holding a lock named from its arguments.

    The call acquires the lock, runs the body under ``hold()`` (the lease renewed
    meanwhile), and releases it, whatever the body does. Inside, ``current_lease()``
    returns the lease (its fence). An async function needs an async backend
    (``RedisLockBackend``, ``MemoryLockBackend``...), a sync one a sync backend
    (``SyncRedisLockBackend``). The wrapper keeps the function's name, docstring,
    signature and ``__wrapped__``.

    Args:
        backend: The lock backend.
        name: The lock's name for a call: a format string over the call's arguments
            by parameter name (``"invoice:{invoice_id}"``, ``"{user.id}"``; defaults
            applied, ``**kwargs`` spread), or a function taking the same arguments and
            returning the name.
        ttl: The lease length in seconds; default 30.0.
        timeout: How long a call waits for the lock, in seconds (0: one attempt);
            default 10.0.
        on_timeout: When the lock is not free within ``timeout``: ``"raise"``
            (default) ``LockNotAcquired``; ``"skip"``: the call returns None without
            running the function.
        mode: Hold the name's read-write lock instead of its exclusive one:
            ``"read"`` (shared with other readers) or ``"write"``; needs a backend
            with modes (``ModalLockBackend``); default None: the exclusive lock.
        renew_every: Seconds between renewals, > 0 and < ``ttl``; default None: a
            third of ``ttl``.
        max_hold: The longest an async call may hold the lock, in seconds (its body is
            cancelled past it: ``LockLost``); default None: no limit. Sync: None only.

    Raises:
        ValueError: (when decorating) A bad option, ``name`` naming no parameter of
            the function, a backend without ``mode``, or an async function with a sync
            backend (or the reverse); (a call) ``name`` could not be formatted from the
            call's arguments.
        TypeError: (a call) The arguments do not fit the function, or a ``name``
            function did not return a str.
        LockNotAcquired: (a call) The lock was not free within ``timeout`` and
            ``on_timeout="raise"``.
        LockLost: (a call) The lease was lost while the body ran (an async body is
            cancelled at once; a sync one is told when it ends).
        BackendUnavailable: (a call) The backend did not answer the acquire.
    """
    _check_options(backend, ttl, timeout, on_timeout, mode, renew_every, max_hold)
    skip = on_timeout == "skip"
    backend_async = inspect.iscoroutinefunction(backend.acquire)

    def decorate(fn: Callable[..., Any], /) -> Callable[..., Any]:
        naming = CallNaming(fn, name)
        if _check_kind(fn, backend.name, backend_async):
            view = cast(ModalLockBackend, backend).for_mode(_MODES[mode]) if mode else backend
            return _wrap_async(
                fn, naming, cast(LockBackend, view), ttl, timeout, skip, renew_every, max_hold
            )
        if max_hold is not None:
            raise ValueError("max_hold applies to async functions only")
        view = cast(SyncModalLockBackend, backend).for_mode(_MODES[mode]) if mode else backend
        return _wrap_sync(fn, naming, cast(SyncLockBackend, view), ttl, timeout, skip, renew_every)

    return cast(LockDecorator[Any], decorate)


_MODES = {"read": READ, "write": WRITE}


def _check_options(
    backend: LockBackend | SyncLockBackend,
    ttl: float,
    timeout: float,
    on_timeout: str,
    mode: Mode,
    renew_every: float | None,
    max_hold: float | None,
) -> None:
    """``locked``'s options, checked when decorating (``ValueError``, ``TypeError``)."""
    check_ttl(ttl)
    check_timeout(timeout)
    _check_hold(ttl, renew_every, max_hold)
    if on_timeout not in ("raise", "skip"):
        raise ValueError(f'on_timeout must be "raise" or "skip", got {on_timeout!r}')
    if mode is not None:
        if mode not in ("read", "write"):
            raise ValueError(f'mode must be "read", "write" or None, got {mode!r}')
        _require(backend, ("read", "write"), "read-write locks")


def _check_kind(fn: Callable[..., Any], backend_name: str, backend_async: bool) -> bool:
    """Whether ``fn`` is async; ``ValueError`` unless its backend is of the same kind."""
    if inspect.iscoroutinefunction(fn):
        if not backend_async:
            raise ValueError(
                f"{fn.__qualname__} is async but the {backend_name} lock backend is "
                "sync: give it an async backend"
            )
        return True
    if backend_async:
        raise ValueError(
            f"{fn.__qualname__} is sync but the {backend_name} lock backend is async: "
            "give it a sync backend (or make the function async)"
        )
    return False


def _wrap_async(
    fn: Callable[..., Awaitable[Any]],
    naming: CallNaming,
    backend: LockBackend,
    ttl: float,
    timeout: float,
    skip: bool,
    renew_every: float | None,
    max_hold: float | None,
) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        lock = Lock(backend, naming(args, kwargs), ttl=ttl, timeout=timeout)
        holding = lock.hold(renew_every=renew_every, max_hold=max_hold)
        entered = False
        try:
            async with holding:
                entered = True
                token = _current.set(lambda: holding.lease)
                try:
                    return await fn(*args, **kwargs)
                finally:
                    _current.reset(token)
        except LockNotAcquired:
            if entered or not skip:  # the body's own LockNotAcquired is never a skip
                raise
            return None

    return run


def _wrap_sync(
    fn: Callable[..., Any],
    naming: CallNaming,
    backend: SyncLockBackend,
    ttl: float,
    timeout: float,
    skip: bool,
    renew_every: float | None,
) -> Callable[..., Any]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        lock = SyncLock(backend, naming(args, kwargs), ttl=ttl, timeout=timeout)
        entered = False
        try:
            with lock.hold(renew_every=renew_every) as lease:
                entered = True
                token = _current.set(lambda: lease)
                try:
                    return fn(*args, **kwargs)
                finally:
                    _current.reset(token)
        except LockNotAcquired:
            if entered or not skip:
                raise
            return None

    return run
