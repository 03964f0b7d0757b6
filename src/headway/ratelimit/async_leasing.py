"""Leased quota for ``RateLimiter``: the lease calls, within the limiter's budget.

The limiter spends from the ``Ledger`` (``leasing.py``) itself, on its hot path; this
is what it does when a key's lease cannot cover a call (``AsyncLeases.decide``: one
lease call, shared by the tasks that miss the same key at once) and what gives a
lease's unspent units back: a timer per lease when its hold ends, a new lease
replacing it, or ``return_all``. ``sync_leasing.py`` is the blocking twin.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from headway._clock import within
from headway._errors import BackendUnavailable
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.backends.leasing_contract import LeasingBackend
from headway.ratelimit.blocked import BlockedCache
from headway.ratelimit.decision import Decision
from headway.ratelimit.leasing import Held, Leasing, Ledger, back_of

__all__ = ["AsyncLeases"]


class AsyncLeases:
    """One async limiter's leases: its ledger, and the backend calls that fill and empty it.

    Args:
        leasing: The limiter's ``Leasing``.
        policies: The limiter's policies.
        backend: The limiter's backend (it leases).
        budget: Seconds each lease call may take.
        nanoseconds: The limiter's clock in integer nanoseconds.
        failed: The limiter's failure-mode decision.
        cache: The limiter's blocked-key cache, or None.
    """

    def __init__(
        self,
        leasing: Leasing,
        policies: PolicySet,
        backend: LeasingBackend,
        budget: float,
        nanoseconds: Callable[[], int],
        failed: Callable[[], Decision],
        cache: BlockedCache | None,
    ) -> None:
        self.ledger = Ledger(leasing, policies)
        self.leasing = leasing
        self.policies = policies
        self.backend = backend
        self.budget = budget
        self.nanoseconds = nanoseconds
        self.failed = failed
        self.cache = cache
        #: Give-backs running in the background.
        self.returns: set[asyncio.Task[None]] = set()

    def now_us(self) -> int:
        """The limiter's clock in integer microseconds."""
        return self.nanoseconds() // 1000

    async def decide(self, key: str, cost: int, peek: bool) -> Decision:
        """Decide when ``key``'s lease cannot: take a new one (one backend call)."""
        ledger = self.ledger
        if peek:  # ask the backend, this lease's units given back first (as a hit would)
            if (held := ledger.take(key)) is not None:
                await self.give_back(key, held)
            return await self._unleased(key, cost, peek)
        pending = ledger.pending.get(key)
        if pending is not None:  # another task is taking a lease for this key: share it
            await asyncio.shield(pending)
            if (local := ledger.spend(key, self.now_us(), cost, peek)) is not None:
                return local
        back = back_of(ledger.take(key))  # a lease spent or ended: return what is left
        mine = asyncio.get_running_loop().create_future()
        ledger.pending.setdefault(key, mine)  # others wait for the first call in flight
        sent = self.now_us()
        try:
            reply = await within(
                self.budget, self.backend.lease(key, self.policies, cost, self.leasing, back)
            )
        except (TimeoutError, BackendUnavailable):
            return self.failed()
        finally:
            if not mine.done():
                mine.set_result(None)
            if ledger.pending.get(key) is mine:
                del ledger.pending[key]
        decision = ledger.decision(reply, cost)
        if reply[0]:
            installed = ledger.install(key, reply, sent, cost)
            self._expire_later(key, installed)
        elif self.cache is not None:
            self.cache.put(key, cost, decision, sent / 1e6)
        return decision

    async def _unleased(self, key: str, cost: int, peek: bool) -> Decision:
        try:
            return await within(self.budget, self.backend.decide(key, self.policies, cost, peek))
        except (TimeoutError, BackendUnavailable):
            return self.failed()

    def _expire_later(self, key: str, replaced: Held | None) -> None:
        held = self.ledger.held[key]
        if replaced is not None:
            self._give_back_later(key, replaced)
        asyncio.get_running_loop().call_later(self.leasing.hold, self._expired, key, held)

    def _expired(self, key: str, held: Held) -> None:
        if (ended := self.ledger.expired(key, held)) is not None:
            self._give_back_later(key, ended)

    def _give_back_later(self, key: str, held: Held) -> None:
        """Return ``held``'s unspent units in the background (lost if the backend fails)."""
        task = asyncio.get_running_loop().create_task(self.give_back(key, held))
        self.returns.add(task)
        task.add_done_callback(self.returns.discard)

    async def give_back(self, key: str, held: Held) -> None:
        """Return ``held``'s unspent units now (lost if the backend fails)."""
        # On failure the units come back anyway, when their window ends or the bucket refills.
        with contextlib.suppress(TimeoutError, BackendUnavailable):
            call = self.backend.lease(key, self.policies, 0, self.leasing, back_of(held))
            await within(self.budget, call)

    async def return_all(self) -> None:
        """Give every lease's unspent units back now, and wait for those going back."""
        for key, held in self.ledger.everything():
            await self.give_back(key, held)
        if self.returns:
            await asyncio.gather(*self.returns, return_exceptions=True)
