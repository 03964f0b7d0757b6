"""``Election``: leader election over any lock backend; the lease's fence is the term.

A candidate *campaigns* by waiting for one lock (the election's ``name``); it leads for
as long as it holds that lock's lease, renewed as ``Lock.hold()`` renews it. The term is
the lease's fencing token, so it rises with every new leader, and a leader's writes
fenced with it (``fenced_update``) are refused once a newer leader has written. A lost
lease cancels the leader's block with ``LockLost``, exactly as ``hold()`` does.

Who leads is read, not campaigned for: ``leader()`` asks the backend's ``inspect``
(the holder's owner label is the leader's identity, its fence the term), and
``observe()`` polls it. ``SyncElection`` (``election_sync.py``) is the sync twin; the
values and helpers both share live here.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType

from headway._clock import Clock
from headway._errors import LockLost, LockNotAcquired
from headway.lock.contract import LockBackend
from headway.lock.introspection import LockState, check_owner
from headway.lock.lease import Lease, _finite_seconds
from headway.lock.lock import Lock, _check_hold
from headway.lock.renewal import Renewal

__all__ = ["Election", "Leader", "Leadership", "default_identity"]

#: ``campaign(timeout=None)`` waits forever, one acquire of this many seconds at a time
#: (acquire timeouts are capped at a week).
_WAIT_CHUNK = 3600.0


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads an election at one moment (it may change as soon as it is read).

    Attributes:
        identity: The leader's ``identity`` (its lock's owner label); None where the
            backend keeps no owner (MySQL's session locks).
        term: The leader's term: its lease's fencing token, higher for every new leader.
        expires_in: Seconds until its lease runs out unrenewed; None where the backend
            cannot tell.
    """

    identity: str | None
    term: int
    expires_in: float | None


def default_identity() -> str:
    """``host:pid``, made to fit an owner label (printable ASCII, no spaces, <= 64).

    Characters a label may not hold become ``-``; a long host name is cut, the pid kept.
    """
    host = re.sub(r"[^\x21-\x7e]", "-", socket.gethostname()) or "host"
    pid = f":{os.getpid()}"
    return host[: 64 - len(pid)] + pid


def leader_of(state: LockState) -> Leader | None:
    """The leader ``state`` shows: its newest holder (an exclusive lock has one), or None.

    Args:
        state: What the backend's ``inspect`` answered for the election's lock.
    """
    if not state.holders:
        return None
    holder = max(state.holders, key=lambda h: h.fence)
    return Leader(holder.owner, holder.fence, holder.expires_in)


def same_term(a: Leader | None, b: Leader | None) -> bool:
    """Whether two readings show the same leadership (``expires_in`` aside)."""
    if a is None or b is None:
        return a is b
    return (a.identity, a.term) == (b.identity, b.term)


def check_election(name: str, identity: str | None) -> str:
    """Validate an election's name and identity; return the identity (default filled in)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("name must not be empty")
    return check_owner(identity) or default_identity()


def check_interval(interval: float) -> float:
    """Validate ``observe``'s polling interval, in seconds."""
    seconds = _finite_seconds("interval", interval)
    if seconds <= 0:
        raise ValueError(f"interval must be > 0, got {interval!r}")
    return seconds


def check_campaign_timeout(timeout: float | None) -> float:
    """``campaign``'s timeout in seconds; ``math.inf`` for None (wait forever)."""
    if timeout is None:
        return math.inf
    seconds = _finite_seconds("timeout", timeout)
    if seconds < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout!r}")
    return seconds


class Election:
    """Leader election among the processes that campaign on ``name``.

    Args:
        backend: The lock backend the candidates share (any ``LockBackend``;
            ``leader()`` and ``observe()`` need an ``InspectableLockBackend``).
        name: The election's name: the lock's resource, the same for every candidate.
        identity: This candidate's label, shown by ``leader()`` to whoever asks (1 to 64
            printable ASCII characters, no spaces); default None: ``host:pid``
            (``default_identity()``).
        ttl: The leadership lease in seconds; default 15.0. A leader that dies is
            replaced within about ``ttl``; one that cannot renew stops leading by then.
        renew_every: Seconds between renewals, > 0 and < ``ttl``; default None: a third
            of ``ttl``.
        clock: The monotonic clock of lease deadlines; default None: ``time.monotonic``
            (give a ``MemoryLockBackend``'s ``FakeClock``).

    Raises:
        TypeError: ``name`` or ``identity`` is not a str, or seconds of the wrong type.
        ValueError: An empty ``name``, a bad ``identity``, ``ttl`` or ``renew_every``.
    """

    def __init__(
        self,
        backend: LockBackend,
        name: str,
        *,
        identity: str | None = None,
        ttl: float = 15.0,
        renew_every: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.identity = check_election(name, identity)
        self.name = name
        self._lock = Lock(backend, name, ttl=ttl, clock=clock, owner=self.identity)
        self.ttl = self._lock.ttl
        self._interval = _check_hold(ttl, renew_every, None)

    def __repr__(self) -> str:
        return f"Election({self.name!r}, identity={self.identity!r}, ttl={self.ttl:g})"

    def campaign(self, *, timeout: float | None = None) -> _Campaign:
        """Lead for an ``async with`` block: wait to be elected, lead, resign on leaving.

        The block runs while this candidate leads; the ``Leadership`` it gets carries
        the ``term`` and the ``lease`` for fenced writes. The lease is renewed while the
        block runs; a lost lease (refused renewal, or the store unreachable until the
        lease ran out) cancels the block, which ends in ``LockLost``. Leaving the block
        resigns: the next candidate is elected at once. ``Leadership.resign()`` leaves
        early: the block is cancelled at its next ``await`` and ends without an error.

        Args:
            timeout: How long to wait to be elected, in seconds (0: one try); default
                None: as long as it takes.

        Raises:
            LockNotAcquired: Not elected within ``timeout``.
            LockLost: Leadership was lost while the block ran; the block was cancelled.
            BackendUnavailable: The backend did not answer while waiting.
            ValueError: A bad ``timeout``.
        """
        return _Campaign(self, check_campaign_timeout(timeout))

    async def leader(self) -> Leader | None:
        """Who leads now (``Leader``), or None: read with the backend's ``inspect``.

        Raises:
            TypeError: The backend cannot tell (it is no ``InspectableLockBackend``).
            BackendUnavailable: The backend did not answer.
        """
        return leader_of(await self._lock.inspect())

    def observe(self, *, interval: float = 1.0) -> AsyncIterator[Leader | None]:
        """Leadership changes, without campaigning: the leader now, then each change.

        It polls ``leader()`` every ``interval`` s (one ``inspect`` each), as every
        backend can answer that; a change is seen at most ``interval`` s plus one
        round trip after it happened, and a leadership shorter than ``interval`` may
        be missed (terms can skip). A store with native watches (etcd, ZooKeeper)
        could push changes instead; that is left for later.

        Args:
            interval: Seconds between two readings (> 0); default 1.0.

        Raises:
            TypeError: The backend cannot tell (it is no ``InspectableLockBackend``).
            BackendUnavailable: The backend did not answer (the iteration ends).
            ValueError: A bad ``interval``.
        """
        return self._observe(check_interval(interval))

    async def _observe(self, interval: float) -> AsyncIterator[Leader | None]:
        shown: Leader | None = None
        first = True
        while True:
            now = await self.leader()
            if first or not same_term(shown, now):
                first, shown = False, now
                yield now
            await asyncio.sleep(interval)

    async def _elected(self, end: float) -> Lease:
        """Wait until ``end`` (``inf``: forever, on the lock's clock) for the election's lock."""
        clock = self._lock.clock
        while True:
            try:
                return await self._lock.acquire(timeout=max(0.0, min(end - clock(), _WAIT_CHUNK)))
            except LockNotAcquired:
                if end - clock() <= 0:
                    raise


class Leadership:
    """What ``Election.campaign()`` yields: this candidate leads while its block runs.

    Made by ``campaign()``, not by hand.

    Args:
        identity: This candidate's identity.
        renewal: The ``Renewal`` keeping the lease alive (and watching it).
        scope: The block's cancel scope, which ``resign()`` ends.

    Attributes:
        identity: This candidate's identity.
        term: The term: the lease's fencing token, higher than every earlier leader's.
    """

    __slots__ = ("_renewal", "_resigned", "_scope", "identity", "term")

    def __init__(self, identity: str, renewal: Renewal, scope: asyncio.Timeout) -> None:
        self.identity = identity
        self.term = renewal.lease.fence
        self._renewal = renewal
        self._scope = scope
        self._resigned = False

    def __repr__(self) -> str:
        return f"Leadership(identity={self.identity!r}, term={self.term})"

    @property
    def lease(self) -> Lease:
        """The current lease (renewed meanwhile): give its ``fence`` to fenced writes."""
        return self._renewal.lease

    @property
    def resigned(self) -> bool:
        """Whether ``resign()`` was called."""
        return self._resigned

    def resign(self) -> None:
        """Stop leading: the block is cancelled at its next ``await`` and ends quietly.

        Leaving the block then releases the lease, so the next candidate is elected at
        once. Call it from the block or from another task of the same event loop (a
        shutdown handler); calling it again does nothing.
        """
        if not self._resigned:
            self._resigned = True
            self._scope.reschedule(asyncio.get_running_loop().time())


class _Campaign:
    """``Election.campaign()``'s context manager: elected on entry, resigns on exit."""

    __slots__ = ("_election", "_leadership", "_timeout")

    def __init__(self, election: Election, timeout: float) -> None:
        self._election = election
        self._timeout = timeout
        self._leadership: Leadership | None = None

    async def __aenter__(self) -> Leadership:
        election = self._election
        lock = election._lock
        end = lock.clock() + self._timeout
        while True:
            renewal = Renewal(
                await election._elected(end), lock.extend, ttl=lock.ttl,
                interval=election._interval, clock=lock.clock, release=lock.release,
            )  # fmt: skip
            try:
                await renewal.begin()  # a stale hand-over is renewed before leading
                break
            except LockLost:
                continue  # it lapsed before we led: campaign again
        # resign()'s cancel scope, inside the renewal's: a loss still ends in LockLost.
        scope = asyncio.timeout(None)
        await scope.__aenter__()
        self._leadership = Leadership(election.identity, renewal, scope)
        return self._leadership

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        leadership = self._leadership
        assert leadership is not None
        quiet = False
        try:
            await leadership._scope.__aexit__(exc_type, exc, tb)
        except TimeoutError:
            if not leadership.resigned:
                raise
            exc_type, exc, tb, quiet = None, None, None, True  # resigned: ended on purpose
        suppress = await leadership._renewal.__aexit__(exc_type, exc, tb)
        return quiet or suppress
