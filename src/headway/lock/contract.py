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

A backend that can take several locks in one step (Redis, when their keys share a slot)
may be a ``MultiAcquireBackend``: ``MultiLock`` then tries ``acquire_many`` first.

A backend whose leases end with a session (PostgreSQL, MySQL) may also be a
``WindowClaimBackend`` (``SyncWindowClaimBackend``): ``run_once`` then claims its
windows in the store (a "locked until" row), so they outlive a runner that dies.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from headway.lock.flow import Attempt, Try
from headway.lock.lease import Lease
from headway.lock.modes import LockMode, ModeKind

__all__ = [
    "AsyncWaiter",
    "LockBackend",
    "ModalLockBackend",
    "MultiAcquireBackend",
    "QueuedPrimitives",
    "SyncLockBackend",
    "SyncModalLockBackend",
    "SyncQueuedPrimitives",
    "SyncWaiter",
    "SyncWindowClaimBackend",
    "WindowClaimBackend",
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


@runtime_checkable
class MultiAcquireBackend(Protocol):
    """A backend that takes, and gives back, several of its locks in one step.

    ``MultiLock`` tries ``acquire_many`` before taking its names one by one, and releases
    with ``release_many``; each may answer None (not for these names), and ``MultiLock``
    then goes one by one. The leases are the same as ``acquire``'s: ``release``,
    ``extend`` and ``hold()`` treat them alike.
    """

    async def acquire_many(self, resources: Sequence[str], ttl: float) -> tuple[Lease, ...] | None:
        """One attempt at every resource at once, all or nothing; no waiting, no queueing.

        A resource is taken only as a single attempt (``acquire`` with ``timeout=0``) would
        take it: free, and no waiter ahead (a backend with a queue never lets a caller cut
        in). Each lease has its own token and a fence from its resource's own sequence. A
        grant whose caller is cancelled is given back.

        Args:
            resources: Distinct names, in the caller's order (``MultiLock``: sorted).
            ttl: Every lease's length in seconds (> 0, at most a week).

        Returns:
            The leases, in ``resources``' order; or None if this backend cannot take these
            resources in one step (nothing was sent).

        Raises:
            LockNotAcquired: Some resource is held, or others wait for it (the error's
                ``resource``: the first such); nothing is held.
            BackendUnavailable: The store cannot answer; nothing is held.
            ValueError: A bad ``ttl``.
        """
        ...

    async def release_many(self, leases: Sequence[Lease]) -> list[bool] | None:
        """Release every lease in one step (shielded from cancellation, as ``release``).

        Args:
            leases: Leases of distinct resources (``acquire_many``'s, or any).

        Returns:
            Per lease, in order, True if released, False if no longer held (untouched); or
            None if this backend cannot release these in one step (nothing was sent).

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...


@runtime_checkable
class WindowClaimBackend(Protocol):
    """A backend that claims ``run_once`` windows in its store, outliving the claimant.

    ``run_once`` uses these methods instead of ``acquire`` / ``extend`` / ``release``
    when its backend offers them: the store keeps, per job, until when its window is
    held (ShedLock's "locked until"), on the store's own clock, so a claimant that dies
    keeps the window for ``at_most_for`` and a process that exits keeps it for
    ``at_least_for``. A backend whose leases already outlive their holder (a key with a
    TTL) need not offer it.
    """

    async def claim_window(self, name: str, at_most_for: float) -> Lease | None:
        """Claim job ``name``'s window for ``at_most_for`` s, or return None if it is held.

        One atomic step that succeeds only if no claim of ``name`` holds the window at
        the store's current time (the store's clock, not the caller's). The lease has a
        fresh token, a fence above every earlier claim's of ``name``, ``ttl`` =
        ``at_most_for``, and a deadline counted from before the claim was sent. A claim
        whose caller is cancelled is ended (as by ``end_window`` with 0).

        Args:
            name: The job's name.
            at_most_for: Seconds the window is held at most (> 0, at most a week).

        Raises:
            BackendUnavailable: The store cannot answer (then nothing ran; the window
                may be held till ``at_most_for``).
            ValueError: A bad ``at_most_for`` (``TypeError`` for a non-number).
        """
        ...

    async def end_window(self, lease: Lease, at_least_for: float) -> bool:
        """End the claim ``lease``: hold the window until ``at_least_for`` s after it was
        claimed (store's clock), or free it now if that has passed.

        Args:
            lease: A lease ``claim_window`` returned.
            at_least_for: Seconds after the claim the window stays held (>= 0).

        Returns:
            False if the claim no longer held the window (it ran past ``at_most_for``).

        Raises:
            BackendUnavailable: The store cannot answer (the window then stays held
                until ``at_most_for`` after the claim).
        """
        ...


@runtime_checkable
class SyncWindowClaimBackend(Protocol):
    """The synchronous counterpart of ``WindowClaimBackend``."""

    def claim_window(self, name: str, at_most_for: float) -> Lease | None:
        """As ``WindowClaimBackend.claim_window``, blocking.

        Args:
            name: The job's name.
            at_most_for: Seconds the window is held at most (> 0, at most a week).

        Raises:
            BackendUnavailable: The store cannot answer.
            ValueError: A bad ``at_most_for``.
        """
        ...

    def end_window(self, lease: Lease, at_least_for: float) -> bool:
        """As ``WindowClaimBackend.end_window``, blocking.

        Args:
            lease: A lease ``claim_window`` returned.
            at_least_for: Seconds after the claim the window stays held (>= 0).

        Returns:
            False if the claim no longer held the window.

        Raises:
            BackendUnavailable: The store cannot answer.
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
