"""Leased quota for ``SyncRateLimiter``: the ledger shared by threads, the blocking calls.

The same ``Ledger`` as the async limiter's, behind its ``lock`` (held only around the
ledger, never across a backend call). What differs from ``RateLimiter``:

- No timer gives a lease back when its hold is up (a sync limiter runs no thread of
  its own): leases whose hold ended go back with the next lease call any thread
  makes (``lapsed``, oldest first: ``hold`` is the same for all, so a queue in
  install order is in deadline order), with the key's own next lease call, or on
  ``return_leases``.
- Threads that miss the same key at once each take a lease; the one installed
  last wins and the others' unspent units go back at once (no waiting on another
  thread's call).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable

from headway._errors import BackendUnavailable
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.backends.leasing_contract import SyncLeasingBackend
from headway.ratelimit.decision import Decision
from headway.ratelimit.leasing import Held, Leasing, Ledger, back_of

__all__ = ["SyncLeases"]


class SyncLeases:
    """One sync limiter's leases: spends under the ledger's lock, lease calls outside it."""

    def __init__(
        self,
        leasing: Leasing,
        policies: PolicySet,
        backend: SyncLeasingBackend,
        nanoseconds: Callable[[], int],
    ) -> None:
        self.ledger = Ledger(leasing, policies)
        self.leasing = leasing
        self.policies = policies
        self.backend = backend
        self.nanoseconds = nanoseconds
        self.lapsing: deque[tuple[int, str, Held]] = deque()  # (hold ends, key, lease)

    def spend(self, key: str, cost: int, peek: bool) -> Decision | None:
        """The decision from ``key``'s lease, or None when it cannot cover ``cost`` now."""
        ledger = self.ledger
        with ledger.lock:
            return ledger.spend(key, self.nanoseconds() // 1000, cost, peek)

    def decide(self, key: str, cost: int, peek: bool) -> Decision:
        """Decide when the lease cannot: one lease call (raises BackendUnavailable)."""
        ledger = self.ledger
        if peek:  # ask the backend, this lease's units given back first (as a hit would)
            with ledger.lock:
                held = ledger.take(key)
            if held is not None:
                self.give_back(key, held)
            return self.backend.decide(key, self.policies, cost, peek)
        with ledger.lock:
            back = back_of(ledger.take(key))  # a lease spent or ended: return what is left
        sent = self.nanoseconds() // 1000
        reply = self.backend.lease(key, self.policies, cost, self.leasing, back)
        if reply[0]:
            with ledger.lock:
                replaced = ledger.install(key, reply, sent, cost)
                self.lapsing.append((sent + ledger.hold_us, key, ledger.held[key]))
            if replaced is not None:  # another thread's lease, taken meanwhile
                self.give_back(key, replaced)
        self.return_lapsed(sent)
        return ledger.decision(reply, cost)

    def return_lapsed(self, now: int) -> None:
        """Give back the unspent units of every lease whose hold ended by ``now`` (us)."""
        ended = []
        ledger = self.ledger
        with ledger.lock:
            while self.lapsing and self.lapsing[0][0] <= now:
                _, key, held = self.lapsing.popleft()
                if (lapsed := ledger.expired(key, held)) is not None:
                    ended.append((key, lapsed))
        for key, held in ended:
            self.give_back(key, held)

    def give_back(self, key: str, held: Held) -> None:
        """Return ``held``'s unspent units (lost if the backend fails: see ``RateLimiter``)."""
        with contextlib.suppress(BackendUnavailable):
            self.backend.lease(key, self.policies, 0, self.leasing, back_of(held))

    def forget(self, key: str) -> None:
        """Drop ``key``'s lease without giving it back (its state was reset)."""
        with self.ledger.lock:
            self.ledger.take(key)

    def return_all(self) -> None:
        """Give every lease's unspent units back now."""
        with self.ledger.lock:
            items = self.ledger.everything()
            self.lapsing.clear()
        for key, held in items:
            self.give_back(key, held)
