"""``RateLimiter``: policies on a backend, with failure modes, for async code.

A thin shell (``shell.Shell``) over the pure parts, awaiting the backend within its
latency budget; ``sync_limiter.py`` is the blocking twin. Leased quota is decided here
from the ``Ledger`` (``leasing.py``) while a lease covers the call, else by
``async_leasing.AsyncLeases`` (the lease calls, a timer per lease for its hold).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from headway._clock import Clock, within
from headway._errors import BackendUnavailable
from headway.ratelimit.arguments import check_seconds
from headway.ratelimit.async_leasing import AsyncLeases
from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.backends.fast_path import fast_path_of
from headway.ratelimit.backends.leasing_contract import LeasingBackend
from headway.ratelimit.backends.memory import MemoryRateLimitBackend
from headway.ratelimit.backends.settling import ReservingBackend
from headway.ratelimit.decision import Decision, decision_from_reply
from headway.ratelimit.leasing import Leasing, Ledger
from headway.ratelimit.policies import Policy
from headway.ratelimit.reservation import Reservation
from headway.ratelimit.shell import Shell, nanoseconds
from headway.ratelimit.waiting import WaitLines

__all__ = ["RateLimiter"]


class RateLimiter(Shell):
    """Several policies guarding each key, checked together in one backend call.

    ``budget`` bounds every backend call in seconds: a backend that fails or is
    slower gives the failure-mode decision: allowed only if every policy says
    ``on_error="allow"``.

    Args:
        *policies: The policies (at least one; no two alike), all checked on each call.
        backend: Where the state lives; default None: a new ``MemoryRateLimitBackend``, for this
            process only.
        budget: Seconds each backend call may take (finite, >= 0); default 0.25.
        retry_on_error: The ``retry_after`` (seconds) of a failure-mode decision that
            denies; default 1.0.
        cache_blocked: Answer rejections for keys known to be blocked without a round
            trip: True (10,000 keys), or the number of keys to remember; default False.
        clock: The monotonic clock of budgets and the blocked-key cache; default None:
            ``time.monotonic``.
        lease: Take quota from the backend in chunks and decide in process, exactly
            (``Leasing``, docs/ratelimit.md); the backend must lease. Default None.
        metered: The policies ``reserve`` charges its estimate and ``settle`` adjusts
            (tokens per minute); the others are charged 1 per reservation (requests per
            minute). Default None: every policy is metered.

    Raises:
        TypeError: A policy that is not one, a backend that cannot lease with ``lease``,
            or a number of seconds of the wrong type.
        ValueError: No policy, two alike, a negative or infinite number of seconds, or a
            metered policy that is not one of ``policies``.
    """

    def __init__(
        self,
        *policies: Policy,
        backend: RateLimitBackend | None = None,
        budget: float = 0.25,
        retry_on_error: float = 1.0,
        cache_blocked: bool | int = False,
        clock: Clock | None = None,
        lease: Leasing | None = None,
        metered: Sequence[Policy] | None = None,
    ) -> None:
        super().__init__(policies, budget, retry_on_error, cache_blocked, clock, metered)
        self.backend: RateLimitBackend = backend or MemoryRateLimitBackend()
        self.lease = lease
        self._lines = WaitLines(self.clock)  # of ``wait``: one FIFO line per key
        self._ns = nanoseconds(self.clock)
        self._leases: AsyncLeases | None = None
        self._ledger: Ledger | None = None  # the leases' ledger, which the hot path spends
        if lease is not None:
            if not callable(getattr(self.backend, "lease", None)):
                raise TypeError(f"backend {self.backend!r} cannot lease quota")
            leasing: LeasingBackend = self.backend  # type: ignore[assignment]
            self._leases = AsyncLeases(
                lease, self.policies, leasing, self.budget, self._ns, self._failed, self.cache
            )
            self._ledger = self._leases.ledger
            # Called when the ledger cannot cover a call (so only with a ledger).
            self._leased = self._leases.decide
        # A built-in backend's fast path (``backends/fast_path.py``), asked for once.
        fast = fast_path_of(self.backend)
        self._submit = None if fast is None else fast.submit
        # Only a fast path's futures are read: without one, ``_read`` is never called.
        self._read = decision_from_reply if fast is None else fast.read
        self._failures = () if fast is None else fast.failures
        # Its reservations' calls, started the same way (when it offers them).
        self._reserve = None if fast is None else fast.reserve
        self._settle = None if fast is None else fast.settle

    async def decide(self, key: str, cost: int = 1, *, peek: bool = False) -> Decision:
        """``hit`` (or, with ``peek``, ``peek``) in one call: for callers choosing per call.

        A backend that fails or is slower than the budget gives the failure-mode
        decision (``Decision.source`` says so), never an error.

        Args:
            key: Whose quota: any str (the identity, often with a prefix).
            cost: Units this call charges (>= 1, and no more than the smallest
                policy's limit); default 1.
            peek: Only look: decide without charging; default False.

        Raises:
            TypeError: ``key`` is not a str, or ``cost`` not an int.
            ValueError: ``cost`` < 1, or more than some policy could ever admit.
        """
        if (cached := self._cached(key, cost)) is not None:
            return cached
        if (ledger := self._ledger) is not None:
            if (local := ledger.spend(key, self._ns() // 1000, cost, peek)) is not None:
                return local  # the hot path: no I/O, no coroutine below this one
            return await self._leased(key, cost, peek)
        sent = 0.0 if self.cache is None else self.clock()
        submit = self._submit
        try:
            # A Decision, a reply's future, or None. Typed Any: mypy narrows ``isinstance``,
            # not ``type() is``, which costs a third as much here (callgrind).
            started: Any = None
            if submit is not None:
                started = submit(key, self.policies, cost, peek, self.budget)
            if started is None:
                decision = await within(
                    self.budget, self.backend.decide(key, self.policies, cost, peek)
                )
            elif type(started) is Decision:  # answered at once: no budget can run out
                decision = started
            else:
                # Written at once: await the reply itself (the budget is the call's timeout),
                # not a stack of coroutines around it.
                decision = self._read(await started, self.policies)
        except (TimeoutError, BackendUnavailable):  # the budget ran out, or ``decide`` failed
            return self._failed()
        except self._failures:  # a future from the fast path failed
            return self._failed()
        if self.cache is not None and not decision.allowed:
            self.cache.put(key, cost, decision, sent)
        return decision

    async def return_leases(self) -> None:
        """Give every lease's unspent units back now (before a process goes idle or exits)."""
        if self._leases is not None:
            await self._leases.return_all()

    async def hit(self, key: str, cost: int = 1) -> Decision:
        """Charge ``cost`` units to ``key`` if every policy admits them.

        Args:
            key: Whose quota: any str (the identity, often with a prefix).
            cost: Units this call charges (>= 1, and no more than the smallest
                policy's limit); default 1.

        Raises:
            TypeError: ``key`` is not a str, or ``cost`` not an int.
            ValueError: ``cost`` < 1, or more than some policy could ever admit.
        """
        ledger = self._ledger
        if ledger is not None and type(key) is str and type(cost) is int and cost > 0:
            # The leased hot path, one coroutine frame: a lease covers only valid costs.
            local = ledger.spend(key, self._ns() // 1000, cost, False)
            if local is not None:
                return local
        return await self.decide(key, cost)

    async def peek(self, key: str, cost: int = 1) -> Decision:
        """The decision ``hit`` would make, without charging anything.

        Args:
            key: Whose quota: any str (the identity, often with a prefix).
            cost: Units a hit would charge (>= 1, and no more than the smallest
                policy's limit); default 1.

        Raises:
            TypeError: ``key`` is not a str, or ``cost`` not an int.
            ValueError: ``cost`` < 1, or more than some policy could ever admit.
        """
        return await self.decide(key, cost, peek=True)

    async def reserve(self, key: str, estimate: int, *, ttl: float = 600.0) -> Reservation:
        """Charge an estimate now, to be settled with the actual cost when it is known.

        Every metered policy is charged ``estimate``, every other one 1, all-or-nothing,
        in one backend call (never from a lease: the settle must find the charge where
        the backend made it). Settle the reservation once with ``settle``; one never
        settled keeps its estimate. A backend that fails or is slower than the budget
        gives the failure-mode decision, and a reservation with nothing to settle.

        Args:
            key: Whose quota: any str (the identity, often with a prefix).
            estimate: Units charged to each metered policy (>= 0, and no more than the
                smallest metered policy's limit).
            ttl: Seconds (of the limiter's clock) after which ``settle`` does nothing
                and the estimate stays charged; default 600.0.

        Raises:
            TypeError: The backend cannot reserve, or an argument of the wrong type.
            ValueError: ``estimate`` out of range, or ``ttl`` not finite and > 0.
        """
        costs, expires = self._reserving(key, estimate, ttl)
        backend: ReservingBackend = self.backend  # type: ignore[assignment]
        reserve = self._reserve
        try:
            started = None if reserve is None else reserve(key, self.policies, costs, self.budget)
            if started is not None:  # written at once: the budget is the call's timeout
                reply = await started
                decision, at_us = decision_from_reply(reply[:-1], self.policies), reply[-1]
            else:
                call = backend.reserve(key, self.policies, costs)
                decision, at_us = await within(self.budget, call)
        except (TimeoutError, BackendUnavailable):  # the budget ran out, or the backend failed
            return self._reservation(key, self._failed(), costs, estimate, None, expires)
        except self._failures:  # a future from the fast path failed
            return self._reservation(key, self._failed(), costs, estimate, None, expires)
        return self._reservation(key, decision, costs, estimate, at_us, expires)

    async def settle(self, reservation: Reservation, actual: int) -> bool:
        """Settle ``reservation`` at ``actual`` units: refund the difference, or charge the rest.

        Only the metered policies change, each by its algorithm's rule (a refund only
        while the reservation's window still counts; a bucket never past full); the rest
        may take the key past its limit (debt: later calls are refused until it is paid).
        Returns True when the backend applied it (no call when ``actual`` is the
        estimate), False when there was nothing to settle (refused, failure mode,
        expired: the estimate stays charged) or the backend failed or was slower than
        the budget (then a call already written may still run, once).

        Args:
            reservation: What ``reserve`` returned, settled once.
            actual: The actual cost, in units (0 to 10**9).

        Raises:
            TypeError: ``reservation`` or ``actual`` of the wrong type.
            ValueError: ``actual`` out of range, or another limiter's reservation.
            RuntimeError: ``reservation`` was settled already.
        """
        costs = self._settling(reservation, actual)
        if costs is None:
            return False
        if costs == reservation.charged:
            return True
        backend: ReservingBackend = self.backend  # type: ignore[assignment]
        key, at_us, charged, settle = (
            reservation.key,
            reservation.at_us,
            reservation.charged,
            self._settle,
        )
        assert at_us is not None
        try:
            started = (
                None
                if settle is None
                else settle(key, self.policies, at_us, charged, costs, self.budget)
            )
            if started is not None:
                reservation.settled_at_us = int(await started)
            else:
                call = backend.settle(key, self.policies, at_us, charged, costs)
                reservation.settled_at_us = await within(self.budget, call)
        except (TimeoutError, BackendUnavailable):
            return False
        except self._failures:
            return False
        return True

    async def reset(self, key: str) -> None:
        """Forget ``key``'s usage under every policy.

        Args:
            key: Whose quota.

        Raises:
            BackendUnavailable: The backend did not answer.
        """
        if self.cache is not None:
            self.cache.forget(key)
        if self._ledger is not None:  # its units were charged to the state forgotten
            self._ledger.take(key)
        await self.backend.reset(key, self.policies)

    async def wait(self, key: str, cost: int = 1, *, timeout: float = 10.0) -> Decision:
        """Hit ``key`` until admitted, for at most ``timeout`` seconds.

        Returns the admitting decision, or the last rejection as soon as the
        next retry could not succeed in time (or a failure-mode decision).
        Concurrent waits on one key take turns in the order they were called: only
        the first asks the backend, the others wait behind it (``ratelimit/waiting.py``).

        Args:
            key: Whose quota: any str (the identity, often with a prefix).
            cost: Units each try charges (>= 1, and no more than the smallest
                policy's limit); default 1.
            timeout: The longest wait in seconds (finite, >= 0); default 10.0.

        Raises:
            TypeError: ``key``, ``cost`` or ``timeout`` of the wrong type.
            ValueError: ``cost`` out of range, or ``timeout`` negative or infinite.
        """
        deadline = self.clock() + check_seconds("timeout", timeout)
        self._check(key, cost)
        return await self._lines.admit(key, functools.partial(self.hit, key, cost), deadline)
