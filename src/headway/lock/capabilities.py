"""Optional capabilities of a lock backend, each a protocol its caller probes for once.

A backend that can take several locks in one step (Redis, when their keys share a slot)
may be a ``MultiAcquireBackend``: ``MultiLock`` then tries ``acquire_many`` first.

A backend whose leases end with a session (PostgreSQL, MySQL) may also be a
``WindowClaimBackend`` (``SyncWindowClaimBackend``): ``run_once`` then claims its
windows in the store (a "locked until" row), so they outlive a runner that dies.

What every backend implements is in ``headway.lock.contract``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from headway.lock.lease import Lease

__all__ = ["MultiAcquireBackend", "SyncWindowClaimBackend", "WindowClaimBackend"]


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
