"""``locked``: run a function under ``hold()`` on a lock named from its arguments.

An async function is held with a ``Lock`` over a ``LockBackend``, a sync one with a
``SyncLock`` over a ``SyncLockBackend``. The lease of the running call is in a context
variable: ``current_lease()`` gives it to the body (its fence, for fenced writes)
without a parameter the callers would have to pass.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import string
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Literal, Never, ParamSpec, Protocol, TypeVar, cast, overload

from headway._errors import LockNotAcquired
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


Name = str | Callable[..., str]
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
    check_ttl(ttl)
    check_timeout(timeout)
    _check_hold(ttl, renew_every, max_hold)
    if on_timeout not in ("raise", "skip"):
        raise ValueError(f'on_timeout must be "raise" or "skip", got {on_timeout!r}')
    if mode is not None:
        if mode not in ("read", "write"):
            raise ValueError(f'mode must be "read", "write" or None, got {mode!r}')
        _require(backend, ("read", "write"), "read-write locks")
    skip = on_timeout == "skip"
    is_async = inspect.iscoroutinefunction(backend.acquire)

    def decorate(fn: Callable[..., Any], /) -> Callable[..., Any]:
        naming = _Naming(fn, name)
        if inspect.iscoroutinefunction(fn):
            if not is_async:
                raise ValueError(
                    f"{fn.__qualname__} is async but the {backend.name} lock backend is "
                    "sync: give it an async backend"
                )
            view = cast(ModalLockBackend, backend).for_mode(_MODES[mode]) if mode else backend
            return _wrap_async(
                fn, naming, cast(LockBackend, view), ttl, timeout, skip, renew_every, max_hold
            )
        if is_async:
            raise ValueError(
                f"{fn.__qualname__} is sync but the {backend.name} lock backend is async: "
                "give it a sync backend (or make the function async)"
            )
        if max_hold is not None:
            raise ValueError("max_hold applies to async functions only")
        view = cast(SyncModalLockBackend, backend).for_mode(_MODES[mode]) if mode else backend
        return _wrap_sync(fn, naming, cast(SyncLockBackend, view), ttl, timeout, skip, renew_every)

    return cast(LockDecorator[Any], decorate)


_MODES = {"read": READ, "write": WRITE}


def _wrap_async(
    fn: Callable[..., Awaitable[Any]],
    naming: _Naming,
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
    naming: _Naming,
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


class _Naming:
    """A call's lock name: ``name`` formatted over the bound arguments, or called."""

    __slots__ = ("_fn", "_name", "_signature")

    def __init__(self, fn: Callable[..., Any], name: Name) -> None:
        self._fn = fn
        self._name = name
        self._signature = inspect.signature(fn)
        if isinstance(name, str):
            self._check(name)
        elif not callable(name):
            raise TypeError(f"name must be a str or a function, not {type(name).__name__}")

    def _check(self, template: str) -> None:
        """Refuse, when decorating, a field that names no parameter (unless ``**kwargs``)."""
        parameters = self._signature.parameters
        spread = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError as exc:
            raise ValueError(f"lock name {template!r} is not a format string: {exc}") from exc
        for field in fields:
            head = field.split(".", 1)[0].split("[", 1)[0]
            if not head or head.isdigit():
                raise ValueError(
                    f"lock name {template!r}: fields name parameters ({{invoice_id}}), "
                    f"not positions ({{{field}}})"
                )
            if head not in parameters and not spread:
                raise ValueError(
                    f"lock name {template!r} names {head!r}, which is no parameter of "
                    f"{self._fn.__qualname__}{self._signature}"
                )

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        name = self._name
        if not isinstance(name, str):
            made = name(*args, **kwargs)
            if not isinstance(made, str):
                raise TypeError(
                    f"the lock name function of {self._fn.__qualname__} returned "
                    f"{type(made).__name__}, not a str"
                )
            return made
        bound = self._signature.bind(*args, **kwargs)  # TypeError as the call would raise
        bound.apply_defaults()
        values: dict[str, Any] = {}
        for key, value in bound.arguments.items():
            kind = self._signature.parameters[key].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                values.update(cast(Mapping[str, Any], value))
            else:
                values[key] = value
        try:
            return name.format_map(values)
        except (KeyError, AttributeError, IndexError) as exc:
            raise ValueError(
                f"lock name {name!r} for {self._fn.__qualname__}: cannot format it from "
                f"the arguments {sorted(values)} ({type(exc).__name__}: {exc})"
            ) from exc
