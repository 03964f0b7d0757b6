"""``ReadWriteLock`` and ``Semaphore`` (and their sync twins): ``Lock``s in a mode.

``ReadWriteLock.read`` and ``.write`` are ``Lock``s over the backend's read and write
modes, and a ``Semaphore`` is a ``Lock`` whose backend grants ``permits`` leases at
once: acquire, release, extend, ``hold()``, fencing, events and errors are the
``Lock``'s. The rules of the modes are in ``headway.lock.modes``.
"""

from __future__ import annotations

from headway._clock import Clock
from headway.lock.contract import ModalLockBackend, SyncModalLockBackend
from headway.lock.events import LockHook
from headway.lock.introspection import LockState
from headway.lock.lock import Lock
from headway.lock.modes import READ, WRITE, ModeKind
from headway.lock.modes import permits as permits_mode
from headway.lock.sync_lock import SyncLock

__all__ = ["ReadWriteLock", "Semaphore", "SyncReadWriteLock", "SyncSemaphore"]


def _require(backend: object, kinds: tuple[ModeKind, ...], what: str) -> None:
    offered: frozenset[str] = getattr(backend, "modes", frozenset())
    if not callable(getattr(backend, "for_mode", None)) or not set(kinds) <= offered:
        name = getattr(backend, "name", type(backend).__name__)
        raise ValueError(
            f"the {name} lock backend does not offer {what} "
            f"(it offers modes: {', '.join(sorted(offered)) or 'none but the exclusive lock'})"
        )


class ReadWriteLock:
    """A named lock shared by readers and held alone by a writer.

    ``read`` and ``write`` are ``Lock``s: ``async with rw.read.hold(): ...``. Requests
    queue in arrival order: a waiting writer stops later readers from overtaking it,
    and readers queued behind a writer enter together after it. Every lease has a
    fence; a writer's is greater than every earlier holder's, a reader's greater than
    the last writer's. Independent of ``Lock(backend, resource)`` on the same name.

    Args:
        backend: A backend with lock modes (``ModalLockBackend``: Redis, PostgreSQL,
            ZooKeeper, memory...).
        resource: The lock's name.
        ttl: The lease length in seconds (> 0, at most a week); default 30.0.
        timeout: How long ``acquire`` waits by default, in seconds; default 10.0.
        clock: The monotonic clock of renewals and of the event hook's times; default
            None: ``time.monotonic``.
        on_event: A ``LockHook`` told each acquire's wait and each lease's hold time
            (``LockEvent``); default None: nothing is timed.
        owner: A label for the holders that ``inspect`` shows; default None.

    Raises:
        ValueError: The backend offers no read-write locks, or a bad ``ttl``,
            ``timeout`` or ``owner``.
    """

    def __init__(
        self,
        backend: ModalLockBackend,
        resource: str,
        *,
        ttl: float = 30.0,
        timeout: float = 10.0,
        clock: Clock | None = None,
        on_event: LockHook | None = None,
        owner: str | None = None,
    ) -> None:
        _require(backend, ("read", "write"), "read-write locks")
        self.read = Lock(
            backend.for_mode(READ), resource, ttl=ttl, timeout=timeout, clock=clock,
            on_event=on_event, owner=owner,
        )  # fmt: skip
        self.write = Lock(
            backend.for_mode(WRITE), resource, ttl=ttl, timeout=timeout, clock=clock,
            on_event=on_event, owner=owner,
        )  # fmt: skip
        self.resource = resource

    async def inspect(self) -> LockState:
        """Who holds the lock now (readers or a writer), and how many wait.

        Raises:
            TypeError: The backend cannot tell (it is no ``InspectableLockBackend``).
            BackendUnavailable: The backend did not answer.
        """
        return await self.write.inspect()

    def __repr__(self) -> str:
        return f"ReadWriteLock({self.resource!r}, backend={self.read.backend.name})"


class Semaphore(Lock):
    """A named lock with ``permits`` holders at once, each a lease with its own fence.

    ``acquire`` takes one permit (waiting in arrival order, woken when one comes
    back), ``hold()`` holds one. A crashed holder's permit comes back when its lease
    ends. Processes may use different ``permits`` for one name: each acquire sets the
    name's number; holders past a lowered number keep their permits.

    Args:
        backend: A backend with lock modes (``ModalLockBackend``: Redis, PostgreSQL,
            ZooKeeper, memory...).
        resource: The lock's name.
        permits: How many holders at once, 1 to 2**30.
        ttl: The lease length in seconds (> 0, at most a week); default 30.0.
        timeout: How long ``acquire`` waits by default, in seconds; default 10.0.
        clock: The monotonic clock of renewals and of the event hook's times; default
            None: ``time.monotonic``.
        on_event: A ``LockHook`` told each acquire's wait and each lease's hold time
            (``LockEvent``); default None: nothing is timed.
        owner: A label for the holders that ``inspect`` shows; default None.

    Raises:
        TypeError: ``permits`` is not an int.
        ValueError: The backend offers no semaphores, or a bad ``ttl``, ``timeout``,
            ``permits`` or ``owner``.
    """

    def __init__(
        self,
        backend: ModalLockBackend,
        resource: str,
        *,
        permits: int,
        ttl: float = 30.0,
        timeout: float = 10.0,
        clock: Clock | None = None,
        on_event: LockHook | None = None,
        owner: str | None = None,
    ) -> None:
        mode = permits_mode(permits)
        _require(backend, ("permits",), "semaphores")
        super().__init__(
            backend.for_mode(mode), resource, ttl=ttl, timeout=timeout, clock=clock,
            on_event=on_event, owner=owner,
        )  # fmt: skip
        self.permits = permits

    def __repr__(self) -> str:
        return (
            f"Semaphore({self.resource!r}, permits={self.permits}, "
            f"backend={self.backend.name}, ttl={self.ttl:g})"
        )


class SyncReadWriteLock:
    """The synchronous ``ReadWriteLock``: ``read`` and ``write`` are ``SyncLock``s.

    Args:
        backend: A backend with lock modes (``SyncModalLockBackend``).
        resource: The lock's name.
        ttl: The lease length in seconds (> 0, at most a week); default 30.0.
        timeout: How long ``acquire`` waits by default, in seconds; default 10.0.
        owner: A label for the holders that ``inspect`` shows; default None.

    Raises:
        ValueError: The backend offers no read-write locks, or a bad ``ttl``,
            ``timeout`` or ``owner``.
    """

    def __init__(
        self,
        backend: SyncModalLockBackend,
        resource: str,
        *,
        ttl: float = 30.0,
        timeout: float = 10.0,
        owner: str | None = None,
    ) -> None:
        _require(backend, ("read", "write"), "read-write locks")
        self.read = SyncLock(
            backend.for_mode(READ), resource, ttl=ttl, timeout=timeout, owner=owner
        )
        self.write = SyncLock(
            backend.for_mode(WRITE), resource, ttl=ttl, timeout=timeout, owner=owner
        )
        self.resource = resource

    def inspect(self) -> LockState:
        """Who holds the lock now (readers or a writer), and how many wait.

        Raises:
            TypeError: The backend cannot tell (it is no ``SyncInspectableLockBackend``).
            BackendUnavailable: The backend did not answer.
        """
        return self.write.inspect()

    def __repr__(self) -> str:
        return f"SyncReadWriteLock({self.resource!r}, backend={self.read.backend.name})"


class SyncSemaphore(SyncLock):
    """The synchronous ``Semaphore``.

    Args:
        backend: A backend with lock modes (``SyncModalLockBackend``).
        resource: The lock's name.
        permits: How many holders at once, 1 to 2**30.
        ttl: The lease length in seconds (> 0, at most a week); default 30.0.
        timeout: How long ``acquire`` waits by default, in seconds; default 10.0.
        owner: A label for the holders that ``inspect`` shows; default None.

    Raises:
        TypeError: ``permits`` is not an int.
        ValueError: The backend offers no semaphores, or a bad ``ttl``, ``timeout``,
            ``permits`` or ``owner``.
    """

    def __init__(
        self,
        backend: SyncModalLockBackend,
        resource: str,
        *,
        permits: int,
        ttl: float = 30.0,
        timeout: float = 10.0,
        owner: str | None = None,
    ) -> None:
        mode = permits_mode(permits)
        _require(backend, ("permits",), "semaphores")
        super().__init__(backend.for_mode(mode), resource, ttl=ttl, timeout=timeout, owner=owner)
        self.permits = permits

    def __repr__(self) -> str:
        return (
            f"SyncSemaphore({self.resource!r}, permits={self.permits}, "
            f"backend={self.backend.name}, ttl={self.ttl:g})"
        )
