"""Read-write locks and semaphores on Redis: a Redis lock backend's ``for_mode`` views.

A view is a queued backend (``headway.lock.driver``) for one ``LockMode``. It sends
``lua/lock/modes/`` scripts (keys and calls from ``mode_keys``) over its backend's
connection and waits through its backend's waker: the views of one backend and its
exclusive locks share one connection and one pub/sub subscription per channel.
A release grants every waiter that now fits, in queue order, and tells each
("<waiter> <fence>" on the channel, or directly for the releasing backend's own).
No riding (``riders``): that is the exclusive lock's. A view is part of its backend
and uses the backend's private members.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headway._redis.wire import forget
from headway.lock.backends.redis.mode_keys import (
    MODE_ACQUIRE,
    MODE_EXTEND,
    MODE_INSPECT,
    MODE_LEAVE,
    MODE_RELEASE,
    ModeCalls,
    handed,
    mode_state,
    released,
)
from headway.lock.contract import AsyncWaiter, SyncWaiter
from headway.lock.driver import QueuedBackend, SyncQueuedBackend
from headway.lock.flow import Attempt, Try
from headway.lock.introspection import LockState
from headway.lock.modes import LockMode

if TYPE_CHECKING:
    from headway.lock.backends.redis.backend import RedisLockBackend
    from headway.lock.backends.redis.sync_backend import SyncRedisLockBackend

__all__ = ["RedisModeBackend", "SyncRedisModeBackend"]


class RedisModeBackend(QueuedBackend):
    """A ``RedisLockBackend``'s locks in one ``LockMode`` (``ModalLockBackend.for_mode``)."""

    name = "redis"

    def __init__(self, backend: RedisLockBackend, mode: LockMode) -> None:
        super().__init__(backend.clock)
        self.mode = mode
        self.node = backend.node
        self._backend = backend
        self._calls = ModeCalls(mode, backend._sharded)

    async def inspect(self, resource: str) -> LockState:
        """The holders of ``resource`` in this mode's family, and how many wait.

        Args:
            resource: The lock's name.
        """
        reply = await self._backend._call(MODE_INSPECT, *self._calls.inspect(resource))
        return mode_state(resource, self.mode.family, reply)

    def _shielded(self) -> bool:
        return self._backend._shielded()

    async def _try(self, resource: str, step: Try) -> Attempt:
        calls, wires = self._calls, self._backend._wires

        def orphan(reply: Any) -> None:  # the driver's ``undo``, without a task
            wire = wires.ready_wire()
            if wire is None:
                return  # the connection is gone: the grant or the place expires
            if Attempt.from_reply(reply).granted:
                forget(wire.submit(MODE_RELEASE, *calls.release(resource, step.token, "", False)))
            elif step.waiter:
                forget(wire.submit(MODE_LEAVE, *calls.leave(resource, step.waiter)))

        keys, args = calls.acquire(resource, step)
        return Attempt.from_reply(await self._backend._call(MODE_ACQUIRE, keys, args, orphan))

    async def _release(self, resource: str, token: str) -> bool:
        channel, waker = self._calls.keys(resource).channel, self._backend._waker

        def tell(reply: Any) -> None:
            # As the reply arrives, even if our caller stopped waiting: our waiters
            # granted here are told by us, not on the channel.
            for waiter, fence in handed(reply):
                waker.hand(channel, waiter, fence)

        retried = not self._backend._wires.direct()
        keys, args = self._calls.release(resource, token, self.node, retried)
        reply = await self._backend._call(MODE_RELEASE, keys, args, tell, always=True)
        return released(reply) == 1

    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        keys, args = self._calls.extend(resource, token, ttl_ms)
        return bool(await self._backend._call(MODE_EXTEND, keys, args))

    async def _leave(self, resource: str, waiter: str) -> None:
        await self._backend._call(MODE_LEAVE, *self._calls.leave(resource, waiter))

    async def _listen(self, resource: str, waiter: str) -> AsyncWaiter:
        return await self._backend._waker.listen(self._calls.keys(resource).channel, waiter)

    def _join(self, resource: str, waiter: str) -> AsyncWaiter | None:
        return self._backend._waker.join(self._calls.keys(resource).channel, waiter)

    async def _unlisten(self, resource: str, waiter: str) -> None:
        await self._backend._waker.part(self._calls.keys(resource).channel, waiter)


class SyncRedisModeBackend(SyncQueuedBackend):
    """A ``SyncRedisLockBackend``'s locks in one ``LockMode``."""

    name = "redis"

    def __init__(self, backend: SyncRedisLockBackend, mode: LockMode) -> None:
        super().__init__(backend.clock)
        self.mode = mode
        self.node = backend.node
        self._backend = backend
        self._calls = ModeCalls(mode, backend._sharded)

    def inspect(self, resource: str) -> LockState:
        """The holders of ``resource`` in this mode's family, and how many wait.

        Args:
            resource: The lock's name.
        """
        reply = self._backend._run(MODE_INSPECT, *self._calls.inspect(resource))
        return mode_state(resource, self.mode.family, reply)

    def _try(self, resource: str, step: Try) -> Attempt:
        keys, args = self._calls.acquire(resource, step)
        return Attempt.from_reply(self._backend._run(MODE_ACQUIRE, keys, args))

    def _release(self, resource: str, token: str) -> bool:
        retried = not self._backend._wire.enabled
        keys, args = self._calls.release(resource, token, self.node, retried)
        reply = self._backend._run(MODE_RELEASE, keys, args)
        channel = self._calls.keys(resource).channel
        for waiter, fence in handed(reply):
            self._backend._waker.hand(channel, waiter, fence)
        return released(reply) == 1

    def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        keys, args = self._calls.extend(resource, token, ttl_ms)
        return bool(self._backend._run(MODE_EXTEND, keys, args))

    def _leave(self, resource: str, waiter: str) -> None:
        self._backend._run(MODE_LEAVE, *self._calls.leave(resource, waiter))

    def _listen(self, resource: str, waiter: str) -> SyncWaiter:
        return self._backend._waker.listen(self._calls.keys(resource).channel, waiter)

    def _join(self, resource: str, waiter: str) -> SyncWaiter | None:
        return self._backend._waker.join(self._calls.keys(resource).channel, waiter)

    def _unlisten(self, resource: str, waiter: str) -> None:
        self._backend._waker.part(self._calls.keys(resource).channel, waiter)
