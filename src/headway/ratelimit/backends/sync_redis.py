"""The sync shell of the Redis rate-limit backend: the same scripts and keys as
``RedisRateLimitBackend``, each call on a socket of the calling thread (``SyncWire``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from headway._clock import Clock
from headway._redis.errors import UNAVAILABLE, unavailable
from headway._redis.resp import Packed
from headway._redis.scripts import Script
from headway._redis.sync_wire import SyncWire
from headway.lock.backends.redis.mode_keys import (
    MODE_EXTEND,
    MODE_RELEASE,
    MODE_TRY,
    released,
)
from headway.ratelimit.algorithms import PolicySet
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

__all__ = ["SyncRedisRateLimitBackend"]


class SyncRedisRateLimitBackend:
    """The synchronous Redis backend (``redis.Redis`` or ``redis.cluster.RedisCluster``).

    The latency budget is the client's socket timeout: set it with ``from_url``.

    Args:
        client: A ``redis.Redis`` or ``redis.cluster.RedisCluster`` client.
        own_connection: Send the scripts over sockets headway drives itself
            (``_redis.sync_wire.SyncWire``; on a Cluster, per node); default True.
            False goes through redis-py.
        clock: As ``RedisRateLimitBackend``'s: for tests only; default None: the
            server's clock.
    """

    name = "redis"

    def __init__(
        self, client: Any, *, own_connection: bool = True, clock: Clock | None = None
    ) -> None:
        self.client = client
        self.clock = clock
        self._wire = SyncWire(client, own_connection)
        # As the async backend's: a decision's arguments packed once per policy set and cost.
        self._packings: dict[PolicySet, Packing] = {}
        self._slot_calls = SlotCalls(isinstance(client, redis.cluster.RedisCluster))

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 1.0, own_connection: bool = True, **options: Any
    ) -> SyncRedisRateLimitBackend:
        """Connect to ``url``; other keyword arguments go to ``redis.Redis.from_url``.

        Args:
            url: The server's URL (``redis://``, ``rediss://``, ``unix://``).
            timeout: The client's connect and socket timeouts, in seconds (unless
                ``options`` set them); default 1.0. It is
                the latency budget of every call.
            own_connection: As for the constructor; default True.
        """
        options.setdefault("socket_connect_timeout", timeout)
        options.setdefault("socket_timeout", timeout)
        return cls(redis.Redis.from_url(url, **options), own_connection=own_connection)

    def close(self) -> None:
        """Close headway's connections (the client stays the caller's)."""
        self._wire.close()

    def decide(self, key: str, policies: Sequence[Policy], cost: int, peek: bool) -> Decision:
        """Decide (see ``RateLimitBackend.decide``): one script call."""
        script: Script
        keys: Sequence[str]
        args: Sequence[int | str] | Packed
        if self.clock is None and isinstance(policies, PolicySet):
            # Every argument but the cost is the limiter's own: packed once per cost. The
            # client's time between calls is the server's too (measured: benchmarks/README.md).
            packing = packing_in(self._packings, policies)
            script, args = packing.script, packing.packed_args(cost, peek)
            keys = tuple(state_keys(key, policies))
        else:
            script = decide_script(policies)
            keys, args = decide_call(key, policies, cost, peek, micros(self.clock))
        try:
            reply = self._wire.call(script, keys, args)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc
        return decision_from_decide(reply, policies)

    def lease(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]] = (0, ()),
    ) -> list[int]:
        """Lease quota (see ``LeasingBackend.lease``): one call of ``ratelimit/lease.lua``."""
        policies = PolicySet.of(policies)
        keys, args = lease_call(key, policies, cost, leasing, back, micros(self.clock))
        try:
            reply = self._wire.call(lease_script(policies), keys, args)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc
        return list(reply)

    def reserve(
        self, key: str, policies: Sequence[Policy], costs: Sequence[int]
    ) -> tuple[Decision, int]:
        """Reserve (see ``ReservingBackend.reserve``): one call of ``ratelimit/reserve.lua``."""
        keys, args = reserve_call(key, policies, costs, micros(self.clock))
        try:
            reply = self._wire.call(reserve_script(policies), keys, args)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc
        return decision_from_reply(reply[:-1], policies), int(reply[-1])

    def settle(
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
            return int(self._wire.call(settle_script(policies), keys, args))
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc

    def reset(self, key: str, policies: Sequence[Policy]) -> None:
        """Delete every policy's state for ``key``."""
        try:
            self.client.delete(*state_keys(key, policies))
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc

    def _slot(self, script: Script, call: tuple[tuple[str, ...], list[Any]]) -> Any:
        try:
            return self._wire.call(script, call[0], call[1])
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc

    def acquire_slot(self, key: str, policy: Concurrency, token: str) -> Grant:
        """Take a concurrency slot (see ``ConcurrencyBackend``): one script call."""
        return grant(
            self._slot(MODE_TRY, self._slot_calls.of(policy).take(key, token, policy.ttl_ms))
        )

    def release_slot(self, key: str, policy: Concurrency, token: str) -> bool:
        """Give a slot back; False when its lease had ended (see the async backend's)."""
        calls, retried = self._slot_calls.of(policy), not self._wire.enabled
        if not retried:
            done = released(self._slot(MODE_RELEASE, calls.short_release(key, token)))
            if done != -1:
                return bool(done)
        return released(self._slot(MODE_RELEASE, calls.release(key, token, "", retried))) == 1

    def extend_slot(self, key: str, policy: Concurrency, token: str, ttl_ms: int) -> bool:
        """Renew a slot's lease; False when it had ended (the semaphore's renewal)."""
        calls = self._slot_calls.of(policy)
        held = self._slot(MODE_EXTEND, calls.short_extend(key, token, ttl_ms))
        if held == -1:
            held = self._slot(MODE_EXTEND, calls.extend(key, token, ttl_ms))
        return bool(held)
