"""What a lock backend implements.

``LockBackend`` / ``SyncLockBackend`` are all ``Lock`` and ``SyncLock`` need:
acquire, release, extend. A backend whose server waits for it (PostgreSQL)
or that runs rounds of its own (Redlock) implements them directly.

A backend with a wait queue implements the primitives of ``QueuedPrimitives``
(or ``SyncQueuedPrimitives``) instead and subclasses ``QueuedBackend`` (or
``SyncQueuedBackend``, in ``headway.lock.driver``): the driver runs the one
acquire flow (``headway.lock.flow``) over them, waits, and makes every step
safe under cancellation. See "Add a lock backend" in ``docs/extending.md``.

A backend that also offers read-write locks or semaphores is a ``ModalLockBackend``
(``SyncModalLockBackend``): ``for_mode`` returns a backend for one ``LockMode``.

Optional capabilities a caller probes for (several locks in one step, ``run_once``'s
windows claimed in the store) are in ``headway.lock.capabilities``; who holds a lock, in
``headway.lock.introspection``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from headway.lock.flow import Attempt, Try
from headway.lock.lease import Lease
from headway.lock.modes import LockMode, ModeKind

__all__ = [
    "AsyncWaiter",
    "LockBackend",
    "ModalLockBackend",
    "QueuedPrimitives",
    "SyncLockBackend",
    "SyncModalLockBackend",
    "SyncQueuedPrimitives",
    "SyncWaiter",
]


class LockBackend(Protocol):
    """An async lock backend: grants, releases and extends leases.

    ``Lock`` passes its calls straight through (a per-call ``ttl`` or ``timeout``
    unchecked), so a backend implementing this directly owns every rule below; a
    ``QueuedBackend`` gets them from the driver. A store that cannot answer raises
    ``BackendUnavailable``.
    """

    #: Names the backend in ``repr``s and lock events.
    name: str

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Return a lease on ``resource``, waiting up to ``timeout`` s, or raise LockNotAcquired.

        Check the arguments first (``check_ttl``, ``check_timeout`` in
        ``headway.lock.lease``: ``ValueError`` / ``TypeError``); ``timeout=0`` is one
        attempt. The lease gets a fresh ``new_token()``, a ``fence`` strictly greater
        than every fence granted earlier on ``resource`` (across releases, expiries and
        crashes), ``ttl`` as granted, and a ``deadline`` that never overstates the lease
        (count it from before the request was sent). While the lease lives nobody else
        is granted ``resource``; once it runs out unreleased, a waiter may be. A waiter
        is woken by a release, not by polling. An acquire that times out or is
        cancelled leaves nothing behind: no place in a queue, and no grant (a grant
        its caller never received is released).

        Args:
            resource: The lock's name.
            ttl: The lease length in seconds (> 0, at most a week).
            timeout: How long to wait, in seconds (0: one attempt; at most a week).

        Raises:
            LockNotAcquired: Not granted within ``timeout``.
            BackendUnavailable: The store cannot answer.
            ValueError: A bad ``ttl`` or ``timeout`` (``TypeError`` for a non-number).
        """
        ...

    async def release(self, lease: Lease) -> None:
        """Release the lease, or raise LockNotOwned if it is no longer held.

        Not held: released before, run out (even if nobody took the lock since), or
        held by another lease, which is left untouched. A release whose caller is
        cancelled once it started still releases (``Lock.release`` promises that and
        relies on the backend for it), then lets the cancellation through.

        Args:
            lease: The lease to release.

        Raises:
            LockNotOwned: The lease is no longer held.
            BackendUnavailable: The store cannot answer.
        """
        ...

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        """Renew the lease for ``ttl`` s from now, or raise LockNotOwned.

        Check ``ttl`` as ``acquire`` does. Return the same token and fence with the new
        ``ttl`` and a deadline counted from before the request was sent:
        ``lease.renewed(ttl_ms, sent)``. A lease that is no longer held (as for
        ``release``) is not brought back. ``hold()`` turns LockNotOwned into LockLost.

        Args:
            lease: The lease to renew.
            ttl: The new length in seconds, from now.

        Raises:
            LockNotOwned: The lease is no longer held.
            BackendUnavailable: The store cannot answer.
            ValueError: A bad ``ttl``.
        """
        ...


class SyncLockBackend(Protocol):
    """The synchronous counterpart of ``LockBackend``."""

    name: str

    def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """As ``LockBackend.acquire``, blocking.

        Args:
            resource: The lock's name.
            ttl: The lease length in seconds (> 0, at most a week).
            timeout: How long to wait, in seconds (0: one attempt; at most a week).

        Raises:
            LockNotAcquired: Not granted within ``timeout``.
            BackendUnavailable: The store cannot answer.
            ValueError: A bad ``ttl`` or ``timeout`` (``TypeError`` for a non-number).
        """

    def release(self, lease: Lease) -> None:
        """As ``LockBackend.release``, blocking.

        Args:
            lease: The lease to release.

        Raises:
            LockNotOwned: The lease is no longer held.
            BackendUnavailable: The store cannot answer.
        """

    def extend(self, lease: Lease, ttl: float) -> Lease:
        """As ``LockBackend.extend``, blocking.

        Args:
            lease: The lease to renew.
            ttl: The new length in seconds, from now.

        Raises:
            LockNotOwned: The lease is no longer held.
            BackendUnavailable: The store cannot answer.
            ValueError: A bad ``ttl``.
        """


class ModalLockBackend(LockBackend, Protocol):
    """A ``LockBackend`` that also holds resources in other modes (``headway.lock.modes``).

    ``ReadWriteLock`` and ``Semaphore`` need one; they refuse, at construction, a
    backend whose ``modes`` lack what they use.
    """

    #: The mode kinds offered: "read" and "write" (read-write locks), "permits" (semaphores).
    modes: frozenset[ModeKind]

    def for_mode(self, mode: LockMode) -> LockBackend:
        """A backend whose leases hold resources in ``mode``, with the rules of ``LockBackend``.

        Requests of one ``mode.family`` on a resource share one FIFO queue and one fence
        sequence; a request is granted when ``modes.fits`` says so: the ``mode.weight`` of
        the live holders, of the requests still waiting ahead of it, and its own fit within
        ``mode.capacity`` (a semaphore's capacity is the newest acquire's: holders past a
        lowered capacity keep their permits, new grants wait). Fences are unique in the
        family on the resource; a writer's exceeds every earlier holder's and a reader's
        every earlier writer's (rising in queue order gives both; requests granted
        together, such as readers woken at once, may hold theirs in any order). A release
        wakes every waiter that now fits, not just the first. The family is independent
        of the resource's exclusive lock and of the other family.

        Args:
            mode: The mode (``READ``, ``WRITE``, or ``permits(n)``); its kind is one of
                ``modes``.
        """
        ...


class SyncModalLockBackend(SyncLockBackend, Protocol):
    """The synchronous counterpart of ``ModalLockBackend``."""

    modes: frozenset[ModeKind]

    def for_mode(self, mode: LockMode) -> SyncLockBackend:
        """As ``ModalLockBackend.for_mode``, blocking.

        Args:
            mode: The mode; its kind is one of ``modes``.
        """
        ...


class AsyncWaiter(Protocol):
    async def wait(self, seconds: float) -> int | None:
        """Return when woken, or after ``seconds``: the fence if handed the lock, else None."""


class SyncWaiter(Protocol):
    def wait(self, seconds: float) -> int | None:
        """Return when woken, or after ``seconds``: the fence if handed the lock, else None."""


class QueuedPrimitives(ABC):
    """The primitives of an async backend with a FIFO wait queue.

    Required: ``_try``, ``_release``, ``_extend``, ``_leave``, ``_listen`` and
    ``_unlisten``. The others are fast paths with safe defaults. Tokens and
    waiter ids come from the flow; a waiter id is unique per acquire.
    """

    #: Names this backend in its waiters' ids (``flow.waiter_id``), for a backend that
    #: hands a released lock to its own waiters directly; "" if it does not.
    node = ""

    @abstractmethod
    async def _try(self, resource: str, step: Try) -> Attempt:
        """One attempt: grant ``step.token`` the lock for ``step.ttl_ms`` with a fence
        above every earlier one, or refuse with the holder's remaining lease (0: free,
        but an earlier waiter goes first). A refused ``step.waiter`` (if not "") keeps
        its place in the queue for ``step.place_ms``. Run again with a token that holds
        the lock, it returns the same grant."""

    @abstractmethod
    async def _release(self, resource: str, token: str) -> bool:
        """Release ``token``'s lease and wake (or hand the lock to) the next waiter;
        False if ``token`` does not hold the lock."""

    @abstractmethod
    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        """Renew ``token``'s lease for ``ttl_ms`` from now; False if it does not hold it."""

    @abstractmethod
    async def _leave(self, resource: str, waiter: str) -> None:
        """Give up ``waiter``'s place; a lock handed to it meanwhile goes to the next."""

    @abstractmethod
    async def _listen(self, resource: str, waiter: str) -> AsyncWaiter:
        """Start routing wake-ups addressed to ``waiter``; ``_unlisten`` ends it.

        If this raises, it leaves nothing behind."""

    @abstractmethod
    async def _unlisten(self, resource: str, waiter: str) -> None:
        """Stop routing wake-ups to ``waiter`` (after ``_listen`` or ``_join``)."""

    def _join(self, resource: str, waiter: str) -> AsyncWaiter | None:
        """Listen as ``_listen`` does if that needs no I/O (others wait here already),
        else None. Listening before the first attempt spares the retry that covers a
        late subscription."""
        return None

    def _ride(self, resource: str, step: Try) -> Attempt | None:
        """Answer ``step`` without I/O if the backend knows the answer (a task of ours
        holds the lock and its release will queue ``step.waiter``), else None."""
        return None

    def _shielded(self) -> bool:
        """True if a call started now finishes, and a grant is undone, even if its caller
        is cancelled: the driver then needs no ``complete`` (a task and three loop
        turns) around ``_try`` and ``_release``."""
        return False


class SyncQueuedPrimitives(ABC):
    """The primitives of a synchronous queued backend: as ``QueuedPrimitives``, blocking.

    Every primitive may be called from several threads at once.
    """

    node = ""  # as ``QueuedPrimitives.node``

    @abstractmethod
    def _try(self, resource: str, step: Try) -> Attempt:
        """As ``QueuedPrimitives._try``."""

    @abstractmethod
    def _release(self, resource: str, token: str) -> bool:
        """As ``QueuedPrimitives._release``."""

    @abstractmethod
    def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        """As ``QueuedPrimitives._extend``."""

    @abstractmethod
    def _leave(self, resource: str, waiter: str) -> None:
        """As ``QueuedPrimitives._leave``."""

    @abstractmethod
    def _listen(self, resource: str, waiter: str) -> SyncWaiter:
        """As ``QueuedPrimitives._listen``."""

    @abstractmethod
    def _unlisten(self, resource: str, waiter: str) -> None:
        """As ``QueuedPrimitives._unlisten``."""

    def _join(self, resource: str, waiter: str) -> SyncWaiter | None:
        """As ``QueuedPrimitives._join``."""
        return None

    def _ride(self, resource: str, step: Try) -> Attempt | None:
        """As ``QueuedPrimitives._ride``."""
        return None
