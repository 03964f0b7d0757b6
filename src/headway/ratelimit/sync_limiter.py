"""``SyncRateLimiter``: the blocking ``RateLimiter``, for code without an event loop.

The same shell (``shell.Shell``); the backend's client bounds each call's time, and
leased quota goes through ``sync_leasing.SyncLeases``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from headway._clock import Clock
from headway._errors import BackendUnavailable
from headway.ratelimit.arguments import check_seconds
from headway.ratelimit.backends.contract import SyncRateLimitBackend
from headway.ratelimit.backends.leasing_contract import SyncLeasingBackend
from headway.ratelimit.backends.memory import SyncMemoryRateLimitBackend
from headway.ratelimit.backends.settling import SyncReservingBackend
from headway.ratelimit.decision import Decision
from headway.ratelimit.leasing import Leasing
from headway.ratelimit.policies import Policy
from headway.ratelimit.reservation import Reservation
from headway.ratelimit.shell import Shell, nanoseconds, retry_pause
from headway.ratelimit.sync_leasing import SyncLeases

__all__ = ["SyncRateLimiter"]


class SyncRateLimiter(Shell):
    """The synchronous ``RateLimiter``: the same calls, for code without an event loop.

    Safe to share between threads. ``lease`` works as in ``RateLimiter``, except that
    a lease whose hold ended goes back with the next lease call rather than on a timer
    (``ratelimit/sync_leasing.py``).

    The latency budget is enforced by the backend's client (its socket timeout,
    see ``SyncRedisRateLimitBackend.from_url``); failures within it give the
    failure-mode decision as in ``RateLimiter``.

    Args:
        *policies: The policies (at least one; no two alike), all checked on each call.
        backend: Where the state lives; default None: a new ``SyncMemoryRateLimitBackend``, for this
            process only.
        retry_on_error: The ``retry_after`` (seconds) of a failure-mode decision that
            denies; default 1.0.
        cache_blocked: Answer rejections for keys known to be blocked without a round
            trip: True (10,000 keys), or the number of keys to remember; default False.
        clock: The monotonic clock of budgets and the blocked-key cache; default None:
            ``time.monotonic``.
        lease: Take quota from the backend in chunks and decide in process, exactly
            (``Leasing``, docs/ratelimit.md); the backend must lease. Default None.
        metered: The policies ``reserve`` charges its estimate and ``settle`` adjusts;
            the others are charged 1 per reservation. Default None: every policy.

    Raises:
        TypeError: A policy that is not one, a backend that cannot lease with ``lease``,
            or a number of seconds of the wrong type.
        ValueError: No policy, two alike, a negative or infinite number of seconds, or a
            metered policy that is not one of ``policies``.
    """

    def __init__(
        self,
        *policies: Policy,
        backend: SyncRateLimitBackend | None = None,
        retry_on_error: float = 1.0,
        cache_blocked: bool | int = False,
        clock: Clock | None = None,
        lease: Leasing | None = None,
        metered: Sequence[Policy] | None = None,
    ) -> None:
        super().__init__(policies, 0.0, retry_on_error, cache_blocked, clock, metered)
        self.backend: SyncRateLimitBackend = backend or SyncMemoryRateLimitBackend()
        self.lease = lease
        self._leases: SyncLeases | None = None
        if lease is not None:
            if not callable(getattr(self.backend, "lease", None)):
                raise TypeError(f"backend {self.backend!r} cannot lease quota")
            leasing: SyncLeasingBackend = self.backend  # type: ignore[assignment]
            self._leases = SyncLeases(lease, self.policies, leasing, nanoseconds(self.clock))

    def decide(self, key: str, cost: int = 1, *, peek: bool = False) -> Decision:
        """``hit`` (or, with ``peek``, ``peek``) in one call: for callers choosing per call.

        A backend that fails (or times out) gives the failure-mode
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
        sent = self.clock()
        try:
            if (leases := self._leases) is not None:
                local = leases.spend(key, cost, peek)
                decision = local if local is not None else leases.decide(key, cost, peek)
            else:
                decision = self.backend.decide(key, self.policies, cost, peek)
        except BackendUnavailable:
            return self._failed()
        return self._remember(key, cost, decision, sent)

    def hit(self, key: str, cost: int = 1) -> Decision:
        """Charge ``cost`` units to ``key`` if every policy admits them.

        Args:
            key: Whose quota: any str (the identity, often with a prefix).
            cost: Units this call charges (>= 1, and no more than the smallest
                policy's limit); default 1.

        Raises:
            TypeError: ``key`` is not a str, or ``cost`` not an int.
            ValueError: ``cost`` < 1, or more than some policy could ever admit.
        """
        leases = self._leases
        # The leased hot path: a lease covers only valid costs.
        if (
            leases is not None
            and type(key) is str
            and type(cost) is int
            and cost > 0
            and (local := leases.spend(key, cost, False)) is not None
        ):
            return local
        return self.decide(key, cost)

    def peek(self, key: str, cost: int = 1) -> Decision:
        """The decision ``hit`` would make, without charging anything.

        Args:
            key: Whose quota: any str (the identity, often with a prefix).
            cost: Units a hit would charge (>= 1, and no more than the smallest
                policy's limit); default 1.

        Raises:
            TypeError: ``key`` is not a str, or ``cost`` not an int.
            ValueError: ``cost`` < 1, or more than some policy could ever admit.
        """
        return self.decide(key, cost, peek=True)

    def reserve(self, key: str, estimate: int, *, ttl: float = 600.0) -> Reservation:
        """Charge an estimate now, to be settled with the actual cost (see
        ``RateLimiter.reserve``).

        Args:
            key: Whose quota: any str.
            estimate: Units charged to each metered policy (>= 0, and no more than the
                smallest metered policy's limit).
            ttl: Seconds after which ``settle`` does nothing; default 600.0.

        Raises:
            TypeError: The backend cannot reserve, or an argument of the wrong type.
            ValueError: ``estimate`` out of range, or ``ttl`` not finite and > 0.
        """
        costs, expires = self._reserving(key, estimate, ttl)
        backend: SyncReservingBackend = self.backend  # type: ignore[assignment]
        try:
            decision, at_us = backend.reserve(key, self.policies, costs)
        except BackendUnavailable:
            return self._reservation(key, self._failed(), costs, estimate, None, expires)
        return self._reservation(key, decision, costs, estimate, at_us, expires)

    def settle(self, reservation: Reservation, actual: int) -> bool:
        """Settle ``reservation`` at ``actual`` units (see ``RateLimiter.settle``).

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
        backend: SyncReservingBackend = self.backend  # type: ignore[assignment]
        assert reservation.at_us is not None
        try:
            reservation.settled_at_us = backend.settle(
                reservation.key, self.policies, reservation.at_us, reservation.charged, costs
            )
        except BackendUnavailable:
            return False
        return True

    def return_leases(self) -> None:
        """Give every lease's unspent units back now (see ``RateLimiter.return_leases``)."""
        if self._leases is not None:
            self._leases.return_all()

    def reset(self, key: str) -> None:
        """Forget ``key``'s usage under every policy.

        Args:
            key: Whose quota.

        Raises:
            BackendUnavailable: The backend did not answer.
        """
        if self.cache is not None:
            self.cache.forget(key)
        if self._leases is not None:  # its units were charged to the state forgotten
            self._leases.forget(key)
        self.backend.reset(key, self.policies)

    def wait(self, key: str, cost: int = 1, *, timeout: float = 10.0) -> Decision:
        """Hit ``key`` until admitted, for at most ``timeout`` seconds.

        Returns the admitting decision, or the last rejection as soon as the
        next retry could not succeed in time (or a failure-mode decision).

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
        while True:
            decision = self.hit(key, cost)
            if (pause := retry_pause(decision, deadline, self.clock())) is None:
                return decision
            time.sleep(pause)
