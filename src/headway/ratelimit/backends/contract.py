"""What a rate-limit backend implements, and the helpers that let a store run headway's algorithms.

A backend decides one call: a key, the limiter's policies, a cost, charge or peek. It
returns a ``Decision`` and raises ``BackendUnavailable`` when it cannot answer; failure
modes, latency budgets, the blocked-key cache and waiting are the limiter's business.
A backend that only stores states (a dict, a table, a document store) runs headway's
algorithms with ``decide_states`` over the states ``state_names`` names: see
``docs/extending.md``, "Add a rate-limit backend". Leased quota (``LeasingBackend``,
which such a store offers with ``lease_states``) and concurrency slots
(``ConcurrencyBackend``) are optional; both built-in backends offer them, and a fast
path of their own that the limiter finds by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from headway._keys import tag_base
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.decision import Decision, decision_from_reply
from headway.ratelimit.lease_model import give_back, lease
from headway.ratelimit.leasing import Leasing
from headway.ratelimit.model import decide
from headway.ratelimit.policies import Concurrency, Policy
from headway.ratelimit.slots import Grant

__all__ = [
    "ConcurrencyBackend",
    "LeasingBackend",
    "RateLimitBackend",
    "SyncConcurrencyBackend",
    "SyncLeasingBackend",
    "SyncRateLimitBackend",
    "decide_states",
    "lease_states",
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


class LeasingBackend(RateLimitBackend, Protocol):
    """An async backend that can also lease quota, for ``RateLimiter(lease=Leasing(...))``.

    Optional: a limiter built with ``lease`` raises ``TypeError`` when its backend has no
    ``lease``; every other limiter only calls ``decide`` and ``reset``. A backend that
    stores states implements ``lease`` with ``lease_states`` over the states
    ``state_names`` names, as it implements ``decide`` with ``decide_states``; the rules
    of ``RateLimitBackend.decide`` hold (atomic per key, the backend's own clock,
    ``BackendUnavailable`` when the store cannot answer). A lease charges the same
    states as ``decide``: a key decided by a plain limiter and leased by another shares
    one quota.
    """

    async def lease(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]] = (0, ()),
    ) -> list[int]:
        """Give back ``back``, then lease quota for a request of ``cost`` units on ``key``.

        ``back`` is ``(units, marks)``: unspent units of this limiter's previous lease
        on ``key`` and one mark per policy from that lease's reply; pass it on as it
        came (``(0, ())``: nothing to give back). Units go back only to a state that
        has not moved on since (the same window; no other charge of the bucket).
        ``cost`` 0 only gives back, and replies ``[0]``. Otherwise the lease charges
        every policy, all-or-nothing, ``granted`` units: at least ``cost``, at most
        ``leasing.chunk`` and ``leasing.share`` of the least remaining quota.

        Replies a list of ints, ``granted`` followed by seven per policy, in order:
        ``[granted, ok, remaining, reset_us, retry_us, off, step, mark, ...]``.
        ``granted`` 0 is a refusal: then ``ok``, ``remaining``, ``reset_us`` and
        ``retry_us`` are what ``decide`` would say for ``cost`` (``ok`` 1 or 0, the
        rest in units and microseconds) and ``off``, ``step``, ``mark`` are 0. Else
        ``ok`` is 1, ``remaining`` and ``reset_us`` are after the charge of
        ``granted``, ``retry_us`` is 0, unit ``i`` of the lease (0 for the request
        that took it) may be spent until ``off + i * step`` microseconds after the
        call, and ``mark`` is what ``back`` carries to the next call. The states
        those numbers come from are headway's leasing model's
        (``ratelimit/lease_model.py``): ``lease_states`` computes the reply.

        Args:
            key: Whose quota.
            policies: The limiter's policies, as for ``decide``.
            cost: Units of the request (0: only give ``back``).
            leasing: The limiter's ``Leasing`` (chunk, share, hold).
            back: ``(units, marks)`` of the previous lease to give back; default
                ``(0, ())``: nothing.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...


class SyncLeasingBackend(SyncRateLimitBackend, Protocol):
    """The blocking ``LeasingBackend``, for ``SyncRateLimiter(lease=Leasing(...))``."""

    def lease(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]] = (0, ()),
    ) -> list[int]:
        """As ``LeasingBackend.lease``, blocking.

        Args:
            key: Whose quota.
            policies: The limiter's policies.
            cost: Units of the request (0: only give ``back``).
            leasing: The limiter's ``Leasing``.
            back: ``(units, marks)`` of the previous lease to give back; default
                ``(0, ())``: nothing.

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


def lease_states(
    policies: Sequence[Policy],
    states: Sequence[object],
    now_us: int,
    cost: int,
    leasing: Leasing,
    back: tuple[int, Sequence[int]] = (0, ()),
) -> tuple[list[int], list[tuple[object, int | None] | None]]:
    """Lease from the stored states: headway's leasing model, for a backend to run.

    The arguments are ``LeasingBackend.lease``'s, with ``states`` and ``now_us`` as in
    ``decide_states`` (one state per policy, in the order ``state_names`` names them;
    the time in integer microseconds on the backend's clock). Returns the reply that
    ``lease`` returns, and the writes: one entry per policy, in order, None to leave
    that state as it is, else ``(state, ttl_us)``. Store each state in place of the
    one read, for at least ``ttl_us`` microseconds; ``ttl_us`` None means that units
    were only given back to the state: keep the expiry the stored state has (a later
    one decides the same). Reading the states, this call and the writes must be one
    atomic step per key.

    Args:
        policies: The limiter's policies.
        states: One stored state per policy, in order (None: none stored).
        now_us: The time in integer microseconds on the backend's clock.
        cost: Units of the request (0: only give ``back``).
        leasing: The limiter's ``Leasing``.
        back: ``(units, marks)`` of the previous lease to give back; default
            ``(0, ())``: nothing.
    """
    policies = PolicySet.of(policies)
    states = list(states)
    writes: list[tuple[object, int | None] | None] = [None] * len(states)
    units, marks = back
    if units:
        leases, specs = policies.leases, policies.specs
        for i, ((_, a, _), mark) in enumerate(zip(specs, marks, strict=True)):
            returned = give_back(leases[i], states[i], mark, units, a)
            if returned is not None:
                states[i] = returned
                writes[i] = (returned, None)
    if cost == 0:
        return [0], writes
    terms = (leasing.chunk, leasing.permille, leasing.hold_us)
    reply, charged = lease(states, policies.checks, policies.leases, now_us, cost, *terms)
    for i, (state, ttl_us) in enumerate(charged or ()):
        writes[i] = (state, ttl_us)
    return reply, writes
