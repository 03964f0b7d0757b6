"""What a rate-limit backend does, and the pure helpers every backend shares.

A backend decides one call: several policies on one key, a cost, charge or
peek. It returns a ``Decision`` and raises ``BackendUnavailable`` when it cannot
answer; failure modes, caching and waiting are the limiter's business, not the
backend's. The limiter's hot path is ``submit``: a backend says there whether
it answers at once, has written the call and awaits its reply, or needs
``decide`` under the limiter's budget. A backend may also keep concurrency
slots (``ConcurrencyBackend``); both built-in ones do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from headway._keys import tag_base
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.decision import Decision
from headway.ratelimit.leasing import Leasing
from headway.ratelimit.policies import Concurrency, Policy
from headway.ratelimit.slots import Grant

__all__ = [
    "ConcurrencyBackend",
    "LeasingBackend",
    "RateLimitBackend",
    "SyncConcurrencyBackend",
    "SyncLeasingBackend",
    "SyncRateLimitBackend",
    "decide_call",
    "lease_call",
    "policy_keys",
    "state_keys",
]


class RateLimitBackend(Protocol):
    """An async backend: decides (and charges) policies for a key, or forgets the key."""

    name: str
    #: What a future from ``submit`` fails with when the backend did not answer (in time):
    #: the limiter then answers with its failure mode, as for ``BackendUnavailable``.
    failures: tuple[type[BaseException], ...]

    def submit(
        self, key: str, policies: PolicySet, cost: int, peek: bool, timeout: float
    ) -> Decision | asyncio.Future[Any] | None:
        """Start ``decide``'s work without a coroutine: the limiter's hot path.

        Returns the ``Decision`` when the backend answers at once (it never waits,
        so no budget applies); or the future of its reply when the call was written
        at once, failing after ``timeout`` seconds (``decision_from_reply`` reads
        it); or None when neither can be done now: the limiter then awaits
        ``decide`` within its budget.
        """
        ...

    def decision_from_reply(self, reply: Any, policies: PolicySet) -> Decision:
        """The decision in the reply a future from ``submit`` resolved to."""
        ...

    async def decide(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        peek: bool,
        *,
        now_us: int | None = None,
    ) -> Decision:
        """Decide ``cost`` against every policy, all-or-nothing.

        ``now_us`` exists for the differential tests only: production calls
        leave it ``None`` and the backend's own clock (Redis ``TIME``) decides.
        """
        ...

    async def reset(self, key: str, policies: Sequence[Policy]) -> None:
        """Forget every policy's state for ``key``."""
        ...


class LeasingBackend(RateLimitBackend, Protocol):
    """An async backend that can lease quota (``RateLimiter(lease=Leasing(...))``)."""

    async def lease(
        self,
        key: str,
        policies: PolicySet,
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]] = (0, ()),
        *,
        now_us: int | None = None,
    ) -> list[int]:
        """Lease for a request of ``cost``, first giving back ``back`` (units, marks).

        Charges ``cost`` to ``leasing.chunk`` units at once (at most ``leasing.share`` of
        the least remaining quota) to every policy, all-or-nothing, and replies
        ``lua/ratelimit/lease.lua``'s list (``lease_model.lease``). ``cost`` 0 only
        gives back. Raises ``BackendUnavailable`` when it cannot answer.
        """
        ...


class SyncRateLimitBackend(Protocol):
    """The synchronous counterpart of ``RateLimitBackend`` (its budget is the client's)."""

    name: str

    def decide(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        peek: bool,
        *,
        now_us: int | None = None,
    ) -> Decision:
        """As ``RateLimitBackend.decide``, blocking."""

    def reset(self, key: str, policies: Sequence[Policy]) -> None:
        """As ``RateLimitBackend.reset``, blocking."""


class SyncLeasingBackend(SyncRateLimitBackend, Protocol):
    """A sync backend that can lease quota (``SyncRateLimiter(lease=Leasing(...))``)."""

    def lease(
        self,
        key: str,
        policies: PolicySet,
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]] = (0, ()),
        *,
        now_us: int | None = None,
    ) -> list[int]:
        """As ``LeasingBackend.lease``, blocking."""
        ...


class ConcurrencyBackend(Protocol):
    """An async backend that keeps concurrency slots (leases) per key.

    These are the primitives of a lock with ``policy.limit`` permits per key:
    ``ratelimit.permits.Permits`` builds the ``Lease`` values, the errors and
    the lock backend contract over them. Each call prunes the leases that
    ended, by the backend's own clock.
    """

    name: str

    async def acquire_slot(self, key: str, policy: Concurrency, token: str) -> Grant:
        """Take a slot for ``token`` if fewer than ``policy.limit`` are held."""
        ...

    async def release_slot(self, key: str, policy: Concurrency, token: str) -> bool:
        """Give the slot back; False when its lease had already ended."""
        ...

    async def extend_slot(self, key: str, policy: Concurrency, token: str, ttl_ms: int) -> bool:
        """Renew the slot's lease for ``ttl_ms`` from now; False when it had ended."""
        ...


class SyncConcurrencyBackend(Protocol):
    """The synchronous counterpart of ``ConcurrencyBackend``."""

    name: str

    def acquire_slot(self, key: str, policy: Concurrency, token: str) -> Grant:
        """As ``ConcurrencyBackend.acquire_slot``, blocking."""

    def release_slot(self, key: str, policy: Concurrency, token: str) -> bool:
        """As ``ConcurrencyBackend.release_slot``, blocking."""

    def extend_slot(self, key: str, policy: Concurrency, token: str, ttl_ms: int) -> bool:
        """As ``ConcurrencyBackend.extend_slot``, blocking."""


def state_keys(key: str, policies: Sequence[Policy]) -> list[str]:
    """The Redis keys holding ``key``'s state (``PolicySet.stored``), sharing its hash tag."""
    base = tag_base("rl", key)
    return [base + suffix for suffix in PolicySet.of(policies).stored]


def policy_keys(key: str, policies: Sequence[Policy]) -> list[str]:
    """One name per policy for ``key``'s state (``PolicySet.suffixes``)."""
    base = tag_base("rl", key)
    return [base + suffix for suffix in PolicySet.of(policies).suffixes]


def decide_call(
    key: str, policies: Sequence[Policy], cost: int, peek: bool, now_us: int | None
) -> tuple[list[str], list[int | str]]:
    """Keys and arguments of ``ratelimit/decide.lua``."""
    policies = PolicySet.of(policies)
    head = ["" if now_us is None else now_us, cost, 1 if peek else 0]
    return state_keys(key, policies), [*head, *policies.flat]


def lease_call(
    key: str,
    policies: PolicySet,
    cost: int,
    leasing: Leasing,
    back: tuple[int, Sequence[int]],
    now_us: int | None,
) -> tuple[list[str], list[int | str]]:
    """Keys and arguments of ``ratelimit/lease.lua``."""
    units, marks = back
    now: int | str = "" if now_us is None else now_us
    head = [now, cost, leasing.chunk, leasing.permille, leasing.hold_us, units]
    for i, (kind, a, b) in enumerate(policies.specs):
        head += (kind, a, b, marks[i] if units else 0)
    return state_keys(key, policies), head
