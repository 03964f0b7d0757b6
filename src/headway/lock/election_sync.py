"""``SyncElection``: the synchronous ``Election``, its lease renewed by a thread.

Sync code cannot be interrupted, so a leader that loses its lease is not stopped: it
learns it from ``SyncLeadership.leading`` (check it between steps) and from the
``LockLost`` raised when its block ends, as ``SyncLock.hold()`` reports it. Its writes
must be fenced with the term, which is what rejects a leader that was paused.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from headway._errors import BackendUnavailable, LockLost, LockNotAcquired, LockNotOwned
from headway.lock.contract import SyncLockBackend
from headway.lock.election import (
    _WAIT_CHUNK,
    Leader,
    check_campaign_timeout,
    check_election,
    check_interval,
    leader_of,
    same_term,
)
from headway.lock.lease import Lease
from headway.lock.lock import _check_hold
from headway.lock.renewal import fresh_sync
from headway.lock.sync_lock import SyncLock

__all__ = ["SyncElection", "SyncLeadership"]


class SyncElection:
    """The synchronous ``Election``: the same campaign over a ``SyncLockBackend``.

    Args:
        backend: The lock backend the candidates share (``SyncRedisLockBackend``...;
            ``leader()`` and ``observe()`` need a ``SyncInspectableLockBackend``).
        name: The election's name: the lock's resource, the same for every candidate.
        identity: This candidate's label, shown by ``leader()`` (1 to 64 printable ASCII
            characters, no spaces); default None: ``host:pid``.
        ttl: The leadership lease in seconds; default 15.0.
        renew_every: Seconds between renewals, > 0 and < ``ttl``; default None: a third
            of ``ttl``.

    Raises:
        TypeError: ``name`` or ``identity`` is not a str, or seconds of the wrong type.
        ValueError: An empty ``name``, a bad ``identity``, ``ttl`` or ``renew_every``.
    """

    def __init__(
        self,
        backend: SyncLockBackend,
        name: str,
        *,
        identity: str | None = None,
        ttl: float = 15.0,
        renew_every: float | None = None,
    ) -> None:
        self.identity = check_election(name, identity)
        self.name = name
        self._lock = SyncLock(backend, name, ttl=ttl, owner=self.identity)
        self.ttl = self._lock.ttl
        self._interval = _check_hold(ttl, renew_every, None)

    def __repr__(self) -> str:
        return f"SyncElection({self.name!r}, identity={self.identity!r}, ttl={self.ttl:g})"

    @contextlib.contextmanager
    def campaign(self, *, timeout: float | None = None) -> Iterator[SyncLeadership]:
        """Lead for a ``with`` block: wait to be elected, lead, resign on leaving.

        A thread renews the lease while the block runs. A lost lease cannot interrupt
        sync code: ``leading`` turns False, and the block's end raises ``LockLost``
        (unless the block raised first). Leaving the block resigns.

        Args:
            timeout: How long to wait to be elected, in seconds (0: one try); default
                None: as long as it takes.

        Raises:
            LockNotAcquired: Not elected within ``timeout``.
            LockLost: Leadership was lost while the block ran; raised when it ends.
            BackendUnavailable: The backend did not answer while waiting.
            ValueError: A bad ``timeout``.
        """
        lease = self._elected(check_campaign_timeout(timeout))
        leadership = SyncLeadership(self.identity, lease, self._lock, self._interval)
        try:
            yield leadership
        finally:
            lost = leadership._step_down()
        if lost is not None:
            raise LockLost(f"leadership of {self.name!r} lost", resource=self.name) from lost

    def leader(self) -> Leader | None:
        """Who leads now (``Leader``), or None: read with the backend's ``inspect``.

        Raises:
            TypeError: The backend cannot tell (it is no ``SyncInspectableLockBackend``).
            BackendUnavailable: The backend did not answer.
        """
        return leader_of(self._lock.inspect())

    def observe(self, *, interval: float = 1.0) -> Iterator[Leader | None]:
        """Leadership changes, without campaigning: the leader now, then each change.

        Polls ``leader()`` every ``interval`` s, as ``Election.observe`` does (the same
        bound: a change is seen within ``interval`` s plus a round trip; a shorter
        leadership may be missed).

        Args:
            interval: Seconds between two readings (> 0); default 1.0.

        Raises:
            TypeError: The backend cannot tell (it is no ``SyncInspectableLockBackend``).
            BackendUnavailable: The backend did not answer (the iteration ends).
            ValueError: A bad ``interval``.
        """
        return self._observe(check_interval(interval))

    def _observe(self, interval: float) -> Iterator[Leader | None]:
        shown: Leader | None = None
        first = True
        while True:
            now = self.leader()
            if first or not same_term(shown, now):
                first, shown = False, now
                yield now
            time.sleep(interval)

    def _elected(self, timeout: float) -> Lease:
        end = time.monotonic() + timeout
        while True:
            try:
                lease = self._lock.acquire(
                    timeout=max(0.0, min(end - time.monotonic(), _WAIT_CHUNK))
                )
            except LockNotAcquired:
                if end - time.monotonic() <= 0:
                    raise
                continue
            try:  # a stale hand-over is renewed before leading, as by hold()
                return fresh_sync(
                    lease, self._lock.extend, ttl=self.ttl, interval=self._interval,
                    release=self._lock.release,
                )  # fmt: skip
            except LockLost:
                continue  # it lapsed before we led: campaign again


class SyncLeadership:
    """What ``SyncElection.campaign()`` yields: this candidate leads while ``leading``.

    Made by ``campaign()``, not by hand: it starts the thread that renews ``lease``.

    Args:
        identity: This candidate's identity.
        lease: The lease just granted.
        lock: The election's ``SyncLock``, to renew and release the lease.
        interval: Seconds between renewals.

    Attributes:
        identity: This candidate's identity.
        term: The term: the lease's fencing token, higher than every earlier leader's.
    """

    def __init__(self, identity: str, lease: Lease, lock: SyncLock, interval: float) -> None:
        self.identity = identity
        self.term = lease.fence
        self._lease = lease
        self._lock = lock
        self._interval = interval
        self._done = threading.Event()
        self._lost: BaseException | None = None
        self._stepped_down = False
        self._guard = threading.Lock()  # one step-down, whichever thread asks first
        self._thread = threading.Thread(
            target=self._renew, name=f"headway-leader-{lock.resource}", daemon=True
        )
        self._thread.start()

    def __repr__(self) -> str:
        return f"SyncLeadership(identity={self.identity!r}, term={self.term})"

    @property
    def lease(self) -> Lease:
        """The current lease (renewed meanwhile): give its ``fence`` to fenced writes."""
        return self._lease

    @property
    def leading(self) -> bool:
        """Whether this candidate still leads: not resigned, not lost, lease not run out."""
        return self._lost is None and not self._done.is_set() and self._lease.remaining() > 0

    def resign(self) -> None:
        """Stop leading now: stop renewing and release the lease (from any thread).

        The block is not interrupted (sync code cannot be): return from it. Leaving it
        then raises nothing (unless the lease was lost before the resignation); calling
        ``resign`` again does nothing.
        """
        self._step_down()

    def _renew(self) -> None:
        while not self._done.wait(min(self._interval, max(0.0, self._lease.remaining()))):
            try:
                self._lease = self._lock.extend(self._lease)
            except LockNotOwned as exc:
                self._lost = exc
                return
            except BackendUnavailable as exc:
                if self._lease.remaining() <= 0:
                    self._lost = exc
                    return

    def _step_down(self) -> BaseException | None:
        """Stop renewing and release, once; why the lease was lost first, if it was."""
        with self._guard:
            if not self._stepped_down:
                self._stepped_down = True
                self._done.set()
                self._thread.join()
                if self._lost is None and self._lease.remaining() <= 0:
                    self._lost = LockLost("lease ran out", resource=self._lock.resource)
                with contextlib.suppress(LockNotOwned, BackendUnavailable):
                    self._lock.release(self._lease)
        return self._lost
