"""The async Redis lock backend (single node or Cluster).

A thin shell: keys, scripts and their arguments come from ``keys``, waiting
from ``waker``, the record of our holders and their riders from ``riders``,
and the acquire flow from ``headway.lock.driver``. This module only sends the
calls and tells the record what their replies mean.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from redis import asyncio as aioredis
from redis.exceptions import ResponseError

from headway._clock import Clock
from headway._redis.errors import UNAVAILABLE, slot_moving, unavailable
from headway._redis.scripts import Script
from headway._redis.wire import Wires, forget
from headway.lock.backends.redis.cluster_waker import ClusterWaker
from headway.lock.backends.redis.keys import (
    ACQUIRE,
    EXTEND,
    INSPECT,
    LEAVE,
    RELEASE,
    acquire_call,
    inspect_call,
    leave_call,
    lock_keys,
    lock_state,
    release_call,
)
from headway.lock.backends.redis.modes import RedisModeBackend
from headway.lock.backends.redis.riders import Riders
from headway.lock.backends.redis.waker import Waker
from headway.lock.contract import AsyncWaiter
from headway.lock.driver import QueuedBackend
from headway.lock.flow import Attempt, Try
from headway.lock.introspection import LockState
from headway.lock.modes import LockMode, ModeKind

__all__ = ["RedisLockBackend"]


class RedisLockBackend(QueuedBackend):
    """Locks on one Redis server or a Redis Cluster (``redis.asyncio`` client).

    On headway's own connection, a task that asks for a lock one of our own tasks holds
    sends nothing: it rides on the holder's release (see ``riders``). Under
    contention within one process that is one script per grant instead of two.

    On a Cluster, waiters listen on sharded channels (``SSUBSCRIBE``), one
    connection per primary (see ``cluster_waker``).

    Offers every mode: ``ReadWriteLock`` and ``Semaphore`` work over it too, on the
    same connection and wake-ups (``for_mode``, see ``modes``).

    Args:
        client: A ``redis.asyncio.Redis`` or ``RedisCluster`` client (``from_url``
            makes one).
        timeout: Bounds every round trip, in seconds: a Redis that is down or
            stalled raises ``BackendUnavailable`` within it; default 2.0.
        own_connection: Send the lock scripts over one pipelined connection per event
            loop that headway drives itself (see ``headway._redis.wire``; on a Cluster
            client, one per primary, routed by slot: ``cluster_wire``): a lone call is
            written at once, calls made concurrently share writes. Default True; False
            sends every call through redis-py.
        clock: The monotonic clock of lease deadlines and waits; default None:
            ``time.monotonic``.
    """

    name = "redis"
    modes: frozenset[ModeKind] = frozenset({"read", "write", "permits"})

    def __init__(
        self,
        client: Any,
        *,
        timeout: float = 2.0,
        own_connection: bool = True,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        self.client = client
        self.timeout = timeout
        self._wires = Wires(client, own_connection)
        self._sharded = isinstance(client, aioredis.RedisCluster)
        self._waker: Waker | ClusterWaker = (
            ClusterWaker(client, timeout) if self._sharded else Waker(client, timeout)
        )
        # One pipelined connection per loop: a rider's leave is written after the
        # release that queued it.
        self._riders = Riders(self._waker, ordered=True, sharded=self._sharded)
        self.node = secrets.token_hex(4)

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 2.0, own_connection: bool = True, **options: Any
    ) -> RedisLockBackend:
        """Connect to ``url``; other keyword arguments go to ``redis.asyncio.Redis.from_url``.

        Args:
            url: The server's URL (``redis://``, ``rediss://``, ``unix://``).
            timeout: The backend's ``timeout`` and the client's connect and socket
                timeouts (unless ``options`` set them), in seconds; default 2.0.
            own_connection: As for the constructor; default True.
        """
        options.setdefault("socket_connect_timeout", timeout)
        options.setdefault("socket_timeout", timeout)
        return cls(
            aioredis.Redis.from_url(url, **options), timeout=timeout, own_connection=own_connection
        )

    def for_mode(self, mode: LockMode) -> RedisModeBackend:
        """This backend's locks in ``mode`` (see ``ModalLockBackend.for_mode``)."""
        return RedisModeBackend(self, mode)

    async def inspect(self, resource: str) -> LockState:
        """Who holds ``resource``'s lock, and how many wait (``InspectableLockBackend``).

        Args:
            resource: The lock's name.
        """
        reply = await self._call(INSPECT, *inspect_call(resource))
        # Our own riders wait on our holder's release, not in Redis's line: counted here,
        # they are invisible to other processes' inspect (docs/decisions/lock.md).
        return lock_state(resource, reply, self._riders.riding(resource))

    async def _call(
        self,
        script: Script,
        keys: Sequence[str],
        args: list[Any],
        orphan: Callable[[Any], object] | None = None,
        always: bool = False,
    ) -> Any:
        try:
            return await self._wires.call(script, keys, args, orphan, self.timeout, always)
        except UNAVAILABLE as exc:
            raise unavailable(exc, self.timeout) from exc
        except ResponseError as exc:
            if slot_moving(exc):
                raise unavailable(exc, self.timeout) from exc
            raise

    def _shielded(self) -> bool:
        # A call on our connection is written before its first await, and a reply
        # nobody waits for goes to the call's ``orphan``.
        return self._wires.ready_wire() is not None

    def _ride(self, resource: str, step: Try) -> Attempt | None:
        if resource not in self._riders.held:  # the common case, without the mutex
            return None
        loop = asyncio.get_running_loop()
        # Only on our own connection, where the release is written before any later
        # leave of the rider's (FIFO).
        home = loop if self._wires.ready_wire() is not None else None
        return self._riders.ride(resource, step, loop.time(), home)

    async def _try(self, resource: str, step: Try) -> Attempt:
        sh = self._sharded

        def orphan(reply: Any) -> None:  # the driver's ``undo``, without a task
            wire = self._wires.ready_wire()
            if wire is None:
                return  # the connection is gone: the grant or the place expires
            if Attempt.from_reply(reply).granted:
                forget(wire.submit(RELEASE, *release_call(resource, step.token, sharded=sh)))
            elif step.waiter:
                forget(wire.submit(LEAVE, *leave_call(resource, step.waiter, sh)))

        keys, args = acquire_call(resource, step, sharded=sh)
        loop = asyncio.get_running_loop()
        sent = loop.time()
        attempt = Attempt.from_reply(await self._call(ACQUIRE, keys, args, orphan))
        if attempt.granted:
            self._riders.hold(resource, step.token, step.ttl_ms, sent, loop)
        return attempt

    async def _release(self, resource: str, token: str) -> bool:
        release = self._riders.releasing(resource, token)
        loop = asyncio.get_running_loop()
        sent = loop.time()  # the handed lease starts after this

        def handed(reply: Any) -> None:
            # Done as the reply arrives, even if our caller stopped waiting, so a waiter
            # of ours handed the lock is not left to its bounded wait.
            self._riders.released(resource, release, reply, sent, self.node, loop)

        retried = not self._wires.direct()
        keys, args = release_call(
            resource, token, self.node, retried, release.riders, self._sharded
        )
        try:
            reply = await self._call(RELEASE, keys, args, handed, always=True)
        except BaseException:
            handed(None)  # queued or not: its riders trying again is safe
            raise
        return bool(reply)

    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        sent = asyncio.get_running_loop().time()
        extended = bool(await self._call(EXTEND, lock_keys(resource).extend, [token, ttl_ms]))
        self._riders.extended(resource, token, ttl_ms, sent, extended)
        return extended

    async def _leave(self, resource: str, waiter: str) -> None:
        if self._riders.leave(resource, waiter):  # always, on one ordered connection
            await self._call(LEAVE, *leave_call(resource, waiter, self._sharded))

    async def _listen(self, resource: str, waiter: str) -> AsyncWaiter:
        return await self._waker.listen(lock_keys(resource, self._sharded).channel, waiter)

    def _join(self, resource: str, waiter: str) -> AsyncWaiter | None:
        return self._waker.join(lock_keys(resource, self._sharded).channel, waiter)

    async def _unlisten(self, resource: str, waiter: str) -> None:
        await self._waker.part(lock_keys(resource, self._sharded).channel, waiter)

    async def aclose(self) -> None:
        """Stop the wake-up listener and return headway's connection to the client's pool.

        The client itself stays the caller's.
        """
        await self._waker.aclose()
        await self._wires.aclose()
