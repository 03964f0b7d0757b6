"""The synchronous Redis lock backend: the async shell's twin for threads.

It sends the same scripts, built by ``keys``, keeps the same record of holders
and riders (``riders``), and waits through ``sync_waker``; the acquire flow is
``headway.lock.driver``'s.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis import cluster as redis_cluster

from headway._clock import Clock
from headway._errors import BackendUnavailable
from headway._redis.errors import UNAVAILABLE, slot_moving, unavailable
from headway._redis.scripts import Script
from headway._redis.sync_wire import SyncWire
from headway.lock.backends.redis.cluster_waker import SyncClusterWaker
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
from headway.lock.backends.redis.modes import SyncRedisModeBackend
from headway.lock.backends.redis.riders import Riders
from headway.lock.backends.redis.sync_waker import SyncWaker
from headway.lock.contract import SyncWaiter
from headway.lock.driver import SyncQueuedBackend
from headway.lock.flow import Attempt, Try
from headway.lock.introspection import LockState
from headway.lock.modes import LockMode, ModeKind

__all__ = ["SyncRedisLockBackend"]

T = TypeVar("T")


class SyncRedisLockBackend(SyncQueuedBackend):
    """The synchronous Redis backend (``redis.Redis`` or ``redis.cluster.RedisCluster``).

    The client's socket timeout bounds every round trip (``from_url`` sets it).

    On headway's own sockets a thread that asks for a lock one of our own threads holds
    rides on the holder's release, as in ``RedisLockBackend`` (see ``riders``).
    Offers every mode, as ``RedisLockBackend`` does (``for_mode``).

    Args:
        client: A ``redis.Redis`` or ``redis.cluster.RedisCluster`` client.
        timeout: Bounds the wake-up channel's waits (its subscription), in seconds, and
            names the bound in ``BackendUnavailable`` messages; default 2.0.
        own_connection: Send the scripts over sockets headway drives itself
            (``headway._redis.sync_wire.SyncWire``; on a Cluster client, one per
            primary, routed by slot: ``sync_cluster_wire``), one per thread in a call;
            default True. False sends every call through redis-py.
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
        self._wire = SyncWire(client, own_connection)
        self._sharded = isinstance(client, redis_cluster.RedisCluster)
        # On a Cluster, sharded channels on a connection per primary (``cluster_waker``).
        self._waker: SyncWaker | SyncClusterWaker = (
            SyncClusterWaker(client, timeout, UNAVAILABLE)
            if self._sharded
            else SyncWaker(client, timeout, UNAVAILABLE)
        )
        # Threads share no socket: a rider's leave may overtake the release that
        # queues it, so the releasing thread sends it.
        self._riders = Riders(self._waker, ordered=False, sharded=self._sharded)
        self.node = secrets.token_hex(4)

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 2.0, own_connection: bool = True, **options: Any
    ) -> SyncRedisLockBackend:
        """Connect to ``url``; other keyword arguments go to ``redis.Redis.from_url``.

        Args:
            url: The server's URL (``redis://``, ``rediss://``, ``unix://``).
            timeout: The backend's ``timeout`` and the client's connect and socket
                timeouts (unless ``options`` set them), in seconds; default 2.0.
            own_connection: As for the constructor; default True.
        """
        options.setdefault("socket_connect_timeout", timeout)
        options.setdefault("socket_timeout", timeout)
        return cls(
            redis.Redis.from_url(url, **options), timeout=timeout, own_connection=own_connection
        )

    def for_mode(self, mode: LockMode) -> SyncRedisModeBackend:
        """This backend's locks in ``mode`` (see ``SyncModalLockBackend.for_mode``)."""
        return SyncRedisModeBackend(self, mode)

    def inspect(self, resource: str) -> LockState:
        """Who holds ``resource``'s lock, and how many wait (``SyncInspectableLockBackend``).

        Args:
            resource: The lock's name.
        """
        reply = self._run(INSPECT, *inspect_call(resource))
        return lock_state(resource, reply, self._riders.riding(resource))

    def _run(self, script: Script, keys: Sequence[str], args: list[Any]) -> Any:
        """Run ``script`` on our sockets (or redis-py), its errors as ``_call``'s."""
        return self._call(lambda: self._wire.call(script, keys, args))

    def _call(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except UNAVAILABLE as exc:
            raise unavailable(exc, self.timeout) from exc
        except redis.ResponseError as exc:
            if slot_moving(exc):  # a resharding: see ``_redis.errors.slot_moving``
                raise unavailable(exc, self.timeout) from exc
            raise

    def _home(self) -> object:
        """Where a rider may ride: on our own sockets only (None on redis-py's)."""
        return self if self._wire.enabled else None

    def _ride(self, resource: str, step: Try) -> Attempt | None:
        if resource not in self._riders.held:  # the common case, without the mutex
            return None
        return self._riders.ride(resource, step, self.clock(), self._home())

    def _try(self, resource: str, step: Try) -> Attempt:
        keys, args = acquire_call(resource, step, sharded=self._sharded)
        sent = self.clock()
        attempt = Attempt.from_reply(self._call(lambda: self._wire.call(ACQUIRE, keys, args)))
        if attempt.granted:
            self._riders.hold(resource, step.token, step.ttl_ms, sent, self._home())
        return attempt

    def _release(self, resource: str, token: str) -> bool:
        release = self._riders.releasing(resource, token)
        sent = self.clock()  # the handed lease starts after this
        retried = not self._wire.enabled
        keys, args = release_call(
            resource, token, self.node, retried, release.riders, self._sharded
        )
        reply: Any = None
        try:
            reply = self._call(lambda: self._wire.call(RELEASE, keys, args))
        finally:
            gone = self._riders.released(resource, release, reply, sent, self.node, self._home())
            for waiter in gone:  # after the release that queued them: never ahead of it
                with contextlib.suppress(BackendUnavailable):
                    self._send_leave(resource, waiter)
        return bool(reply)

    def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        keys = lock_keys(resource).extend
        sent = self.clock()
        extended = bool(self._call(lambda: self._wire.call(EXTEND, keys, [token, ttl_ms])))
        self._riders.extended(resource, token, ttl_ms, sent, extended)
        return extended

    def _leave(self, resource: str, waiter: str) -> None:
        if self._riders.leave(resource, waiter):
            self._send_leave(resource, waiter)

    def _send_leave(self, resource: str, waiter: str) -> None:
        keys, args = leave_call(resource, waiter, self._sharded)
        self._call(lambda: self._wire.call(LEAVE, keys, args))

    def _listen(self, resource: str, waiter: str) -> SyncWaiter:
        return self._waker.listen(lock_keys(resource, self._sharded).channel, waiter)

    def _join(self, resource: str, waiter: str) -> SyncWaiter | None:
        return self._waker.join(lock_keys(resource, self._sharded).channel, waiter)

    def _unlisten(self, resource: str, waiter: str) -> None:
        self._waker.part(lock_keys(resource, self._sharded).channel, waiter)

    def close(self) -> None:
        """Stop the wake-up listener and close headway's connections.

        The client itself stays the caller's.
        """
        self._waker.close()
        self._wire.close()
