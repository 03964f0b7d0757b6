"""What a rate-limit backend implements, and the helpers that let a store run headway's algorithms.

A backend decides one call: a key, the limiter's policies, a cost, charge or peek. It
returns a ``Decision`` and raises ``BackendUnavailable`` when it cannot answer; failure
modes, latency budgets, the blocked-key cache and waiting are the limiter's business.
A backend that only stores states (a dict, a table, a document store) runs headway's
algorithms with ``decide_states`` over the states ``state_names`` names: see
``docs/extending.md``, "Add a rate-limit backend". Leased quota (``LeasingBackend``,
which such a store offers with ``lease_states``: ``leasing_contract.py``) and concurrency slots
(``ConcurrencyBackend``) are optional; both built-in backends offer them, and a fast
path of their own that the limiter finds by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from headway._keys import tag_base
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.decision import Decision, decision_from_reply
from headway.ratelimit.model import decide
from headway.ratelimit.policies import Concurrency, Policy
from headway.ratelimit.slots import Grant

__all__ = [
    "ConcurrencyBackend",
    "RateLimitBackend",
    "SyncConcurrencyBackend",
    "SyncRateLimitBackend",
    "decide_states",
    "state_names",
]


class RateLimitBackend(Protocol):
    """An async rate-limit backend: decides calls on a key, and forgets a key.

    ``name`` names it in ``repr``s and logs. Time is the backend's own: a clock every
    process deciding on the same store shares (Redis reads its server's ``TIME``), or,
    in one process, a ``Clock`` injected at construction (``MemoryRateLimitBackend``'s
    ``clock``), so that tests move time with a ``FakeClock``.
    """

    name: str

    async def decide(self, key: str, policies: Sequence[Policy], cost: int, peek: bool) -> Decision:
        """Decide ``cost`` units for ``key`` against every policy, all-or-nothing.

        Admitted when every policy admits ``cost``; then, unless ``peek``, every policy is
        charged, else none is. ``policies`` are the limiter's, validated (no two alike),
        the same sequence on each call of one limiter; ``cost`` is at least 1 and at most
        every policy's limit. The state of ``key`` under one set of policies is its own:
        another limiter's policies on the same key share nothing with it. Each call must
        be atomic against concurrent calls on the same key (in every process).
        ``decide_states`` makes the decision from stored states. The limiter's budget
        cancels a call that is too slow.

        Args:
            key: Whose quota (the limiter's key, any str).
            policies: The limiter's policies, validated (no two alike), the same
                sequence on each call of one limiter.
            cost: Units asked, at least 1 and at most every policy's limit.
            peek: Decide without charging.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...

    async def reset(self, key: str, policies: Sequence[Policy]) -> None:
        """Forget what ``key`` was charged under ``policies`` (the states ``state_names`` names).

        Args:
            key: Whose quota.
            policies: The limiter's policies.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...


class SyncRateLimitBackend(Protocol):
    """The blocking ``RateLimitBackend``, for ``SyncRateLimiter`` (safe to share between
    threads; the store's client bounds each call's time)."""

    name: str

    def decide(self, key: str, policies: Sequence[Policy], cost: int, peek: bool) -> Decision:
        """As ``RateLimitBackend.decide``, blocking.

        Args:
            key: Whose quota.
            policies: The limiter's policies.
            cost: Units asked.
            peek: Decide without charging.

        Raises:
            BackendUnavailable: The store cannot answer (or its client timed out).
        """
        ...

    def reset(self, key: str, policies: Sequence[Policy]) -> None:
        """As ``RateLimitBackend.reset``, blocking.

        Args:
            key: Whose quota.
            policies: The limiter's policies.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
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
        """Take a slot for ``token`` if fewer than ``policy.limit`` are held.

        The slot's lease lasts ``policy.ttl`` on the backend's clock.

        Args:
            key: Whose slots (the limiter's key).
            policy: The ``Concurrency`` policy (its ``limit``, ``ttl`` and key part).
            token: The slot's lease token (random, the holder's own).

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...

    async def release_slot(self, key: str, policy: Concurrency, token: str) -> bool:
        """Give the slot back; False when its lease had already ended.

        Args:
            key: Whose slots (the limiter's key).
            policy: The ``Concurrency`` policy (its ``limit``, ``ttl`` and key part).
            token: The slot's lease token (random, the holder's own).

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...

    async def extend_slot(self, key: str, policy: Concurrency, token: str, ttl_ms: int) -> bool:
        """Renew the slot's lease for ``ttl_ms`` from now; False when it had ended.

        Args:
            key: Whose slots (the limiter's key).
            policy: The ``Concurrency`` policy (its ``limit``, ``ttl`` and key part).
            token: The slot's lease token (random, the holder's own).
            ttl_ms: The new lease length in milliseconds.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...


class SyncConcurrencyBackend(Protocol):
    """The synchronous counterpart of ``ConcurrencyBackend``."""

    name: str

    def acquire_slot(self, key: str, policy: Concurrency, token: str) -> Grant:
        """As ``ConcurrencyBackend.acquire_slot``, blocking.

        Args:
            key: Whose slots.
            policy: The ``Concurrency`` policy.
            token: The slot's lease token.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...

    def release_slot(self, key: str, policy: Concurrency, token: str) -> bool:
        """As ``ConcurrencyBackend.release_slot``, blocking.

        Args:
            key: Whose slots.
            policy: The ``Concurrency`` policy.
            token: The slot's lease token.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...

    def extend_slot(self, key: str, policy: Concurrency, token: str, ttl_ms: int) -> bool:
        """As ``ConcurrencyBackend.extend_slot``, blocking.

        Args:
            key: Whose slots.
            policy: The ``Concurrency`` policy.
            token: The slot's lease token.
            ttl_ms: The new lease length in milliseconds.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...


def state_names(key: str, policies: Sequence[Policy]) -> list[str]:
    """One name per policy (in order) for the state ``key`` keeps under ``policies``.

    Each is unique to the key, the policy and the set of policies it is decided with;
    ``reset`` forgets exactly these.

    Args:
        key: The limiter's key.
        policies: The limiter's policies.
    """
    base = tag_base("rl", key)
    return [base + suffix for suffix in PolicySet.of(policies).suffixes]


def decide_states(
    policies: Sequence[Policy],
    states: Sequence[object],
    now_us: int,
    cost: int,
    peek: bool,
) -> tuple[Decision, list[tuple[object, int]]]:
    """Decide a call from the stored states: headway's algorithms, for a backend to run.

    ``states`` holds one value per policy, in order (see ``state_names``): what the
    last charge wrote, or None when nothing was stored or it was dropped. ``now_us`` is
    the time in integer microseconds on the backend's clock. Returns the decision
    (as ``RateLimitBackend.decide`` describes it) and the writes: for a call that
    charged, one ``(state, ttl_us)`` per policy, in order, else an empty list. Store
    each state in place of the one read, for at least ``ttl_us`` microseconds; after
    that it may be dropped (a state kept longer decides the same). States are small
    values of ints, tuples and lists that may come back from JSON as lists. Reading
    the states, this call and the writes must be one atomic step per key.

    Args:
        policies: The limiter's policies.
        states: One stored state per policy, in order (None: none stored).
        now_us: The time in integer microseconds on the backend's clock.
        cost: Units asked (>= 1).
        peek: Decide without charging (no writes).
    """
    policies = PolicySet.of(policies)
    reply, writes = decide(states, policies.checks, now_us, cost, peek)
    return decision_from_reply(reply, policies), [] if writes is None else writes
