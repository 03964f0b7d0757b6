"""The Redis rate-limit backend (single node or Cluster); its sync shell is in ``sync_redis``.

A decision is one call of ``ratelimit/decide.lua`` (or ``decide_one.lua``), preceded
by the library script and the fragments of the algorithms its policies use
(``redis_scripts.decide_script``): an ``FCALL`` of its function, the library loaded on
the same call when missing (``_redis.scripts``). A lease is one call of
``ratelimit/lease.lua``. The async shell offers ``RateLimiter`` its fast path
(``fast_path.FastPath``): the call written on headway's pipelined connection without a
coroutine, its arguments packed once per policy set (``redis_scripts.Packing``).
Concurrency slots (the permits of ``ratelimit.permits``) are a semaphore's permits
(``redis_slots``): an acquire is one call of the answer-at-once ``lock/modes/try``, a
release or a renewal one of the semaphore's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from redis import asyncio as aioredis

from headway._clock import Clock
from headway._errors import BackendUnavailable
from headway._redis.errors import UNAVAILABLE, unavailable
from headway._redis.resp import Packed
from headway._redis.scripts import Script
from headway._redis.wire import Wires, forget
from headway.lock.backends.redis.mode_keys import MODE_EXTEND, MODE_RELEASE, MODE_TRY, released
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.backends.fast_path import FastPath
from headway.ratelimit.backends.redis_scripts import (
    Packing,
    decide_call,
    decide_script,
    lease_call,
    lease_script,
    micros,
    packing_in,
    reserve_call,
    reserve_script,
    settle_call,
    settle_script,
    state_keys,
)
from headway.ratelimit.backends.redis_slots import SlotCalls, grant
from headway.ratelimit.decision import Decision, decision_from_decide, decision_from_reply
from headway.ratelimit.leasing import Leasing
from headway.ratelimit.policies import Concurrency, Policy
from headway.ratelimit.slots import Grant

__all__ = ["RedisRateLimitBackend"]

#: Whether calls go over headway's pipelined connection (``_redis.wire``) unless told otherwise.
OWN_CONNECTION = True
#: What a call on headway's connection fails with: redis-py's errors (its deadline too).
_FAILURES: tuple[type[BaseException], ...] = (BackendUnavailable, *UNAVAILABLE)


class RedisRateLimitBackend:
    """Rate limits on one Redis server or a Redis Cluster (``redis.asyncio`` client).

    The latency budget is the limiter's (``RateLimiter(budget=...)``); connection
    and socket timeouts on the client bound what the budget cannot interrupt.

    Args:
        client: A ``redis.asyncio.Redis`` or ``RedisCluster`` client (``from_url``
            makes one).
        own_connection: Send the scripts over one pipelined connection per event loop
            (on a Cluster, per node: ``_redis.cluster_wire``) that headway drives itself
            (see ``_redis.wire``): a lone decision is written at once, decisions made
            concurrently share writes. Default True; False sends every call through
            redis-py.
        clock: Replaces the server's ``TIME`` (seconds) in every decision and lease:
            for tests that move time by hand (a ``FakeClock``), never for processes
            that do not share it. Default None: the server's clock.
    """

    name = "redis"

    def __init__(
        self, client: Any, *, own_connection: bool = OWN_CONNECTION, clock: Clock | None = None
    ) -> None:
        self.client = client
        self.clock = clock
        self._wires = Wires(client, own_connection)
        self.own_connection = self._wires.enabled
        self._slot_calls = SlotCalls(isinstance(client, aioredis.RedisCluster))
        # By policy set (equal sets pack alike, so limiters made per call share one).
        self._packings: dict[PolicySet, Packing] = {}
        # The last one used: one limiter per backend finds it without hashing its policies.
        self._recent: Packing | None = None

    def _packing(self, policies: PolicySet) -> Packing:
        packing = self._recent
        if packing is None or packing.policies is not policies:
            packing = self._recent = packing_in(self._packings, policies)
        return packing

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout: float = 1.0,
        own_connection: bool = OWN_CONNECTION,
        **options: Any,
    ) -> RedisRateLimitBackend:
        """Connect to ``url``; other keyword arguments go to ``redis.asyncio.Redis.from_url``.

        Args:
            url: The server's URL (``redis://``, ``rediss://``, ``unix://``).
            timeout: The client's connect and socket timeouts, in seconds (unless
                ``options`` set them); default 1.0.
            own_connection: As for the constructor; default True.
        """
        options.setdefault("socket_connect_timeout", timeout)
        options.setdefault("socket_timeout", timeout)
        return cls(aioredis.Redis.from_url(url, **options), own_connection=own_connection)

    async def decide(self, key: str, policies: Sequence[Policy], cost: int, peek: bool) -> Decision:
        """Decide (see ``RateLimitBackend.decide``): one script call."""
        script: Script
        keys: Sequence[str]
        args: Sequence[int | str] | Packed
        if self.clock is None and isinstance(policies, PolicySet):
            # Every argument but the cost is the limiter's own: packed once per cost.
            packing = self._packing(policies)
            script, args = packing.script, packing.packed_args(cost, peek)
            keys = tuple(state_keys(key, policies))
        else:
            script = decide_script(policies)
            keys, args = decide_call(key, policies, cost, peek, micros(self.clock))
        try:
            reply = await self._wires.call(script, keys, args)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc
        return decision_from_decide(reply, policies)

    def _fast_path(self) -> FastPath | None:
        """The limiter's fast path (``fast_path.FastPath``), when calls go over headway's
        connection and the server's clock decides."""
        if not self.own_connection or self.clock is not None:
            return None
        return FastPath(
            self._submit, decision_from_decide, _FAILURES, self._submit_reserve, self._submit_settle
        )

    def _submit(
        self, key: str, policies: PolicySet, cost: int, peek: bool, timeout: float
    ) -> asyncio.Future[Any] | None:
        """Write a decision now and return the future of ``ratelimit/decide.lua``'s reply.

        No coroutine of its own; the budget is the call's ``timeout`` (redis-py's
        ``TimeoutError``). None when the call cannot be written at once (no connection
        yet): the limiter awaits ``decide``.
        """
        wire = self._wires.ready_wire()
        if wire is None:
            return None
        packing = self._packing(policies)
        args = packing.packed_args(cost, peek)
        return wire.submit(packing.script, packing.packed_keys(key), args, None, timeout)

    def _submit_reserve(
        self, key: str, policies: PolicySet, costs: tuple[int, ...], timeout: float
    ) -> asyncio.Future[Any] | None:
        """Write a reservation now: the future of ``ratelimit/reserve.lua``'s reply (as
        ``_submit``), or None when no connection is ready."""
        wire = self._wires.ready_wire()
        if wire is None:
            return None
        packing = self._packing(policies)
        args = packing.packed_reserve(costs)
        return wire.submit(packing.reserve_script, packing.packed_keys(key), args, None, timeout)

    def _submit_settle(
        self,
        key: str,
        policies: PolicySet,
        at_us: int,
        charged: tuple[int, ...],
        actual: tuple[int, ...],
        timeout: float,
    ) -> asyncio.Future[Any] | None:
        """Write a settle now: the future of ``ratelimit/settle.lua``'s reply, or None."""
        wire = self._wires.ready_wire()
        if wire is None:
            return None
        packing = self._packing(policies)
        _, args = settle_call(key, policies, at_us, charged, actual, None)
        keys = packing.packed_keys(key)
        return wire.submit(settle_script(policies), keys, args, None, timeout)

    async def lease(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]] = (0, ()),
    ) -> list[int]:
        """Lease quota (see ``LeasingBackend.lease``): one call of ``ratelimit/lease.lua``."""
        script: Script | None
        keys: Sequence[str]
        args: Sequence[int | str] | Packed
        policies = PolicySet.of(policies)
        if self.clock is None and not back[0]:
            # The common call (a lease spent, nothing to give back): packed once per cost,
            # and the keys as a tuple, whose packing is remembered (~5 us fewer per call).
            packing = self._packing(policies)
            script = packing.lease_script
            if script is None:
                script = packing.lease_script = lease_script(policies)
            args, keys = packing.packed_lease(cost, leasing), tuple(state_keys(key, policies))
        else:
            script = lease_script(policies)
            keys, args = lease_call(key, policies, cost, leasing, back, micros(self.clock))
        try:
            reply = await self._wires.call(script, keys, args)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc
        return list(reply)

    async def reserve(
        self, key: str, policies: Sequence[Policy], costs: Sequence[int]
    ) -> tuple[Decision, int]:
        """Reserve (see ``ReservingBackend.reserve``): one call of ``ratelimit/reserve.lua``."""
        script: Script
        keys: Sequence[str]
        args: Sequence[int | str] | Packed
        if self.clock is None and isinstance(policies, PolicySet):
            # A limiter's call: its arguments packed once per set of costs (as ``decide``).
            packing = self._packing(policies)
            script, args = packing.reserve_script, packing.packed_reserve(tuple(costs))
            keys = tuple(state_keys(key, policies))
        else:
            script = reserve_script(policies)
            keys, args = reserve_call(key, policies, costs, micros(self.clock))
        try:
            reply = await self._wires.call(script, keys, args)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc
        return decision_from_reply(reply[:-1], policies), int(reply[-1])

    async def settle(
        self,
        key: str,
        policies: Sequence[Policy],
        at_us: int,
        charged: Sequence[int],
        actual: Sequence[int],
    ) -> int:
        """Settle (see ``ReservingBackend.settle``): one call of ``ratelimit/settle.lua``."""
        keys, args = settle_call(key, policies, at_us, charged, actual, micros(self.clock))
        try:
            return int(await self._wires.call(settle_script(policies), keys, args))
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc

    async def aclose(self) -> None:
        """Return headway's connection to the client's pool (the client stays the caller's)."""
        await self._wires.aclose()

    async def reset(self, key: str, policies: Sequence[Policy]) -> None:
        """Delete every policy's state for ``key``."""
        try:
            await self.client.delete(*state_keys(key, policies))
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc

    async def _slot(
        self,
        script: Script,
        call: tuple[tuple[str, ...], list[Any]],
        orphan: Callable[[Any], object] | None = None,
    ) -> Any:
        try:
            return await self._wires.call(script, call[0], call[1], orphan)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc

    async def acquire_slot(self, key: str, policy: Concurrency, token: str) -> Grant:
        """Take a concurrency slot (see ``ConcurrencyBackend``): one script call."""
        calls = self._slot_calls.of(policy)

        def orphan(reply: Any) -> None:  # granted to a caller who gave up: give it back
            wire = self._wires.ready_wire()
            if wire is not None and grant(reply).granted:
                forget(wire.submit(MODE_RELEASE, *calls.release(key, token, "", False)))

        return grant(await self._slot(MODE_TRY, calls.take(key, token, policy.ttl_ms), orphan))

    async def release_slot(self, key: str, policy: Concurrency, token: str) -> bool:
        """Give a slot back; False when its lease had ended. The semaphore's release, in
        its short call (two keys) unless redis-py may send it twice; a short call
        answered -1 (somebody waits: never on a limiter's keys) is sent whole."""
        calls, retried = self._slot_calls.of(policy), not self._wires.direct()
        if not retried:
            done = released(await self._slot(MODE_RELEASE, calls.short_release(key, token)))
            if done != -1:
                return bool(done)
        call = calls.release(key, token, "", retried)
        return released(await self._slot(MODE_RELEASE, call)) == 1

    async def extend_slot(self, key: str, policy: Concurrency, token: str, ttl_ms: int) -> bool:
        """Renew a slot's lease; False when it had ended (the semaphore's renewal)."""
        calls = self._slot_calls.of(policy)
        held = await self._slot(MODE_EXTEND, calls.short_extend(key, token, ttl_ms))
        if held == -1:
            held = await self._slot(MODE_EXTEND, calls.extend(key, token, ttl_ms))
        return bool(held)
