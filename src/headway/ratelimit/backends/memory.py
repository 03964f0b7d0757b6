"""The in-memory rate-limit backend: the embedded default and the reference model.

It decides with ``contract.decide_states`` (the ``model``) and leases with
``leasing_contract.lease_states`` (the ``lease_model``) over a dict in one process,
with the scripts' semantics: one state per policy (``contract.state_names``), the same
TTLs (an expired state reads as missing), the same replies. Concurrency slots are a
semaphore's permits in the lock family's own model (``lock.backends.memory_modes``:
``Families.take``, ``release``, ``extend``), named as on Redis (``slots.slot_key``).
Time comes from an injectable clock (monotonic by default: one process needs no
shared clock). A decision never waits, so the
limiter's fast path (``fast_path``) always has it at once.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headway._clock import Clock, MonotonicClock
from headway._errors import BackendUnavailable
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.backends.contract import decide_states, state_names
from headway.ratelimit.backends.fast_path import FastPath
from headway.ratelimit.backends.leasing_contract import lease_states
from headway.ratelimit.backends.settling import reserve_states, settle_states
from headway.ratelimit.decision import Decision, decision_from_reply
from headway.ratelimit.leasing import Leasing
from headway.ratelimit.policies import Concurrency, Policy
from headway.ratelimit.slots import Grant, slot_key

if TYPE_CHECKING:
    from headway.lock.backends.memory_modes import Families

__all__ = ["MemoryRateLimitBackend", "SyncMemoryRateLimitBackend"]


class _Store:
    def __init__(self, clock: Clock | None) -> None:
        self.clock: Clock = clock or MonotonicClock()
        self.entries: dict[str, tuple[Any, int]] = {}  # key -> (state, expires at, us)
        self._slots: Families | None = None  # made by the first slot (``slots``)
        self._sweep_at = 1024
        # Sync callers may share a backend between threads; each decision is atomic.
        self._mutex = threading.Lock()

    def decide(self, key: str, policies: Sequence[Policy], cost: int, peek: bool) -> Decision:
        names = state_names(key, policies)
        with self._mutex:
            now = self._now()
            states = [self._get(name, now) for name in names]
            decision, writes = decide_states(policies, states, now, cost, peek)
            if writes:
                self._write(names, writes, now)
                if len(self.entries) >= self._sweep_at:
                    self._sweep(now)
        return decision

    def lease(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]],
        now_us: int | None = None,
    ) -> list[int]:
        """Lease (``lease_states``); ``now_us`` (else the clock's) for the model's tests."""
        names = state_names(key, policies)
        with self._mutex:
            now = self._now() if now_us is None else now_us
            states = [self._get(name, now) for name in names]
            reply, writes = lease_states(policies, states, now, cost, leasing, back)
            for name, write in zip(names, writes, strict=True):
                if write is None:
                    continue
                state, ttl_us = write
                if ttl_us is None:  # units given back: the state keeps its expiry
                    self.entries[name] = (state, self.entries[name][1])
                else:
                    self.entries[name] = (state, _expiry(now, ttl_us))
            return reply

    def reserve(
        self, key: str, policies: Sequence[Policy], costs: Sequence[int]
    ) -> tuple[Decision, int]:
        names = state_names(key, policies)
        with self._mutex:
            now = self._now()
            states = [self._get(name, now) for name in names]
            decision, writes = reserve_states(policies, states, now, costs)
            self._write(names, writes, now)
            return decision, now

    def settle(
        self,
        key: str,
        policies: Sequence[Policy],
        at_us: int,
        charged: Sequence[int],
        actual: Sequence[int],
    ) -> int:
        names = state_names(key, policies)
        with self._mutex:
            now = self._now()
            states = [self._get(name, now) for name in names]
            self._write(names, settle_states(policies, states, now, at_us, charged, actual), now)
            return now

    def _write(self, names: list[str], writes: Sequence[tuple[Any, int] | None], now: int) -> None:
        for name, write in zip(names, writes, strict=False):
            if write is not None:
                self.entries[name] = (write[0], _expiry(now, write[1]))

    @property
    def slots(self) -> Families:
        """The slots: a semaphore's permits per slot key, leases that end unless renewed."""
        if self._slots is None:
            # Imported here: a rate limiter that takes no slot never loads the lock modules.
            from headway.lock.backends.memory_modes import Families

            self._slots = Families(self.clock)
        return self._slots

    def _slot_families(self) -> int:
        return 0 if self._slots is None else len(self._slots.states)

    def _get(self, key: str, now: int) -> Any:
        entry = self.entries.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self.entries[key]
            return None
        return entry[0]

    def _sweep(self, now: int) -> None:
        # Amortised: sweep when the dicts have doubled since the last sweep.
        self.entries = {k: e for k, e in self.entries.items() if e[1] > now}
        if self._slots is not None:
            self._slots.sweep()
        self._sweep_at = max(1024, 2 * (len(self.entries) + self._slot_families()))

    def _now(self) -> int:
        return round(self.clock() * 1_000_000)

    def acquire_slot(self, key: str, policy: Concurrency, token: str) -> Grant:
        with self._mutex:
            slots = ("permits", slot_key(key, policy))
            granted, held, wait = self.slots.take(slots, token, policy.ttl_ms, policy.limit)
            if len(self.entries) + self._slot_families() >= self._sweep_at:
                self._sweep(self._now())
            return Grant(granted, held, max(1, math.ceil(wait * 1e6)) if wait > 0 else 0)

    def release_slot(self, key: str, policy: Concurrency, token: str) -> bool:
        with self._mutex:
            return self.slots.release(("permits", slot_key(key, policy)), token)

    def extend_slot(self, key: str, policy: Concurrency, token: str, ttl_ms: int) -> bool:
        with self._mutex:
            return self.slots.extend(("permits", slot_key(key, policy)), token, ttl_ms)

    def reset(self, key: str, policies: Sequence[Policy]) -> None:
        with self._mutex:
            for k in state_names(key, policies):
                self.entries.pop(k, None)


class MemoryRateLimitBackend:
    """Rate limits for one process (async API), with the Redis scripts' semantics.

    Args:
        clock: The clock of every decision (monotonic seconds); default None:
            ``time.monotonic``. Tests inject a ``FakeClock`` to move time by hand.
    """

    name = "memory"

    def __init__(self, clock: Clock | None = None) -> None:
        self._store = _Store(clock)

    async def decide(self, key: str, policies: Sequence[Policy], cost: int, peek: bool) -> Decision:
        """Decide (see ``RateLimitBackend.decide``)."""
        return self._store.decide(key, policies, cost, peek)

    def _fast_path(self) -> FastPath:
        # Every decision is made at once (``read`` never gets a reply).
        return FastPath(self._submit, decision_from_reply, (BackendUnavailable,))

    def _submit(
        self, key: str, policies: PolicySet, cost: int, peek: bool, timeout: float
    ) -> Decision:
        return self._store.decide(key, policies, cost, peek)

    async def reset(self, key: str, policies: Sequence[Policy]) -> None:
        """Forget ``key``."""
        self._store.reset(key, policies)

    async def lease(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]] = (0, ()),
    ) -> list[int]:
        """Lease quota (see ``LeasingBackend.lease``): ``lease_states`` over the dict."""
        return self._store.lease(key, policies, cost, leasing, back)

    async def reserve(
        self, key: str, policies: Sequence[Policy], costs: Sequence[int]
    ) -> tuple[Decision, int]:
        """Reserve (see ``ReservingBackend.reserve``): ``reserve_states`` over the dict."""
        return self._store.reserve(key, policies, costs)

    async def settle(
        self,
        key: str,
        policies: Sequence[Policy],
        at_us: int,
        charged: Sequence[int],
        actual: Sequence[int],
    ) -> int:
        """Settle (see ``ReservingBackend.settle``): ``settle_states`` over the dict."""
        return self._store.settle(key, policies, at_us, charged, actual)

    async def acquire_slot(self, key: str, policy: Concurrency, token: str) -> Grant:
        """Take a concurrency slot (see ``ConcurrencyBackend``)."""
        return self._store.acquire_slot(key, policy, token)

    async def release_slot(self, key: str, policy: Concurrency, token: str) -> bool:
        """Give a slot back; False when its lease had ended."""
        return self._store.release_slot(key, policy, token)

    async def extend_slot(self, key: str, policy: Concurrency, token: str, ttl_ms: int) -> bool:
        """Renew a slot's lease; False when it had ended."""
        return self._store.extend_slot(key, policy, token, ttl_ms)


class SyncMemoryRateLimitBackend:
    """Rate limits for one process (sync API), with the Redis scripts' semantics.

    Args:
        clock: The clock of every decision (monotonic seconds); default None:
            ``time.monotonic``. Tests inject a ``FakeClock`` to move time by hand.
    """

    name = "memory"

    def __init__(self, clock: Clock | None = None) -> None:
        self._store = _Store(clock)

    def decide(self, key: str, policies: Sequence[Policy], cost: int, peek: bool) -> Decision:
        """Decide (see ``RateLimitBackend.decide``)."""
        return self._store.decide(key, policies, cost, peek)

    def reset(self, key: str, policies: Sequence[Policy]) -> None:
        """Forget ``key``."""
        self._store.reset(key, policies)

    def lease(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]] = (0, ()),
    ) -> list[int]:
        """Lease quota (see ``LeasingBackend.lease``): ``lease_states`` over the dict."""
        return self._store.lease(key, policies, cost, leasing, back)

    def reserve(
        self, key: str, policies: Sequence[Policy], costs: Sequence[int]
    ) -> tuple[Decision, int]:
        """Reserve (see ``ReservingBackend.reserve``): ``reserve_states`` over the dict."""
        return self._store.reserve(key, policies, costs)

    def settle(
        self,
        key: str,
        policies: Sequence[Policy],
        at_us: int,
        charged: Sequence[int],
        actual: Sequence[int],
    ) -> int:
        """Settle (see ``ReservingBackend.settle``): ``settle_states`` over the dict."""
        return self._store.settle(key, policies, at_us, charged, actual)

    def acquire_slot(self, key: str, policy: Concurrency, token: str) -> Grant:
        """Take a concurrency slot (see ``ConcurrencyBackend``)."""
        return self._store.acquire_slot(key, policy, token)

    def release_slot(self, key: str, policy: Concurrency, token: str) -> bool:
        """Give a slot back; False when its lease had ended."""
        return self._store.release_slot(key, policy, token)

    def extend_slot(self, key: str, policy: Concurrency, token: str, ttl_ms: int) -> bool:
        """Renew a slot's lease; False when it had ended."""
        return self._store.extend_slot(key, policy, token, ttl_ms)


def _expiry(now: int, ttl_us: int) -> int:
    """When a state written at ``now`` for ``ttl_us`` expires: scripts round TTLs up to
    whole milliseconds, and so does the model."""
    return now + max(1, -(-ttl_us // 1000)) * 1000
