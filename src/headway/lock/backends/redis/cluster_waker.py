"""Wake-ups on a Redis Cluster: sharded channels, one waker per primary.

A lock's release publishes on its sharded channel (``SPUBLISH``), which only
the primary that owns the lock's slot (and its replicas) carry; a classic
``PUBLISH`` is copied to every node of the Cluster over its bus. So the waiters
of one backend listen on one connection per primary: each channel on the node
that owns its slot now (the client's slot map), through a ``Waker`` (or a
``SyncWaker``) of that node's own. redis-py's Cluster pub/sub reads its nodes
in turn, each with the whole timeout, so a message on one node waits behind a
quiet other: hence a reader per node, ours.

When a slot moves, its node ends the subscriptions (``sunsubscribe``) and its
waker wakes their waiters, who try again; a node that dies wakes its waiters
likewise. Before each wait a waiter checks that its waker is still the one of
the node serving its channel; if not (the client's slot map changed), it
listens on the new owner and returns at once, so the flow tries again before
it waits (a hand-over published before the new subscription is found by that
attempt). Anything missed meanwhile costs a bounded wait (``WAIT_CAP``), never
safety.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from redis import asyncio as aioredis

from headway.lock.backends.redis.sync_waker import SyncWaker, _ThreadWaiter
from headway.lock.backends.redis.waker import Waker, _EventWaiter
from headway.lock.flow import Wake

__all__ = ["ClusterWaker", "SyncClusterWaker"]


def _owner_name(cluster: Any, channel: str) -> Any:
    """The node that owns ``channel``'s slot (the client's map), or None if unknown."""
    try:
        return cluster.get_node_from_key(channel)
    except Exception:  # no map yet, or the slot is uncovered: the waiter waits alone
        return None


class _RoutedWaiter:
    """A task's waiter that follows its channel to the node serving it."""

    def __init__(self, wakers: ClusterWaker, channel: str, waiter: str) -> None:
        self._wakers = wakers
        self.channel = channel
        self.waiter = waiter
        self.home: Waker | None = None
        self.inner = _EventWaiter(Wake(asyncio.Event()))  # nobody wakes it: it waits its bound

    async def wait(self, seconds: float) -> int | None:
        if self.inner.wake.event.is_set() or self._wakers.route(self.channel) is self.home:
            return await self.inner.wait(seconds)
        await self._wakers.part(self.channel, self.waiter)
        await self._wakers.settle(self)
        return None  # try again now: the new subscription may have missed a hand-over


class ClusterWaker:
    """The async backend's wake-ups on a ``redis.asyncio.RedisCluster``."""

    def __init__(self, cluster: Any, timeout: float) -> None:
        self._cluster = cluster
        self._timeout = timeout
        self._wakers: dict[str, tuple[Waker, Any]] = {}  # node name -> waker, its client
        self._homes: dict[tuple[str, str], Waker] = {}  # (channel, waiter) -> its waker

    def route(self, channel: str) -> Waker | None:
        """The waker of the node serving ``channel`` (by the client's slot map)."""
        node = _owner_name(self._cluster, channel)
        if node is None:
            return None
        known = self._wakers.get(node.name)
        if known is None:
            # A client of its own on the node's connection settings (credentials, TLS).
            pool = aioredis.ConnectionPool(
                connection_class=node.connection_class, **node.connection_kwargs
            )
            client = aioredis.Redis(connection_pool=pool)
            known = self._wakers[node.name] = (Waker(client, self._timeout, sharded=True), client)
        return known[0]

    async def listen(self, channel: str, waiter: str) -> _RoutedWaiter:
        """As ``Waker.listen``, on the node that serves ``channel``."""
        routed = _RoutedWaiter(self, channel, waiter)
        await self.settle(routed)
        return routed

    async def settle(self, routed: _RoutedWaiter) -> None:
        """Listen for ``routed`` on the node serving its channel now."""
        channel, waiter = routed.channel, routed.waiter
        routed.home = waker = self.route(channel)
        if waker is None:
            return
        self._homes[channel, waiter] = waker
        try:
            routed.inner = await waker.listen(channel, waiter)
        except BaseException:
            self._homes.pop((channel, waiter), None)
            raise

    def join(self, channel: str, waiter: str) -> _RoutedWaiter | None:
        """As ``Waker.join``, on the node that serves ``channel``."""
        waker = self.route(channel)
        joined = waker.join(channel, waiter) if waker is not None else None
        if waker is None or joined is None:
            return None
        self._homes[channel, waiter] = waker
        routed = _RoutedWaiter(self, channel, waiter)
        routed.home, routed.inner = waker, joined
        return routed

    async def part(self, channel: str, waiter: str) -> None:
        """As ``Waker.part``, on the waker ``waiter`` listened on."""
        waker = self._homes.pop((channel, waiter), None)
        if waker is not None:
            await waker.part(channel, waiter)

    def hand(self, channel: str, waiter: str, fence: int | None) -> None:
        """As ``Waker.hand``."""
        waker = self._homes.get((channel, waiter))
        if waker is not None:
            waker.hand(channel, waiter, fence)

    async def aclose(self) -> None:
        """Close every node's waker and its client."""
        wakers, self._wakers = list(self._wakers.values()), {}
        self._homes.clear()
        for waker, client in wakers:
            await waker.aclose()
            await client.aclose()


class _RoutedThreadWaiter:
    """A thread's waiter that follows its channel to the node serving it."""

    def __init__(self, wakers: SyncClusterWaker, channel: str, waiter: str) -> None:
        self._wakers = wakers
        self.channel = channel
        self.waiter = waiter
        self.home: SyncWaker | None = None
        self.inner = _ThreadWaiter(Wake(threading.Event()))  # it waits its bound

    def wait(self, seconds: float) -> int | None:
        if self.inner.wake.event.is_set() or self._wakers.route(self.channel) is self.home:
            return self.inner.wait(seconds)
        self._wakers.part(self.channel, self.waiter)
        self._wakers.settle(self)
        return None  # try again now: the new subscription may have missed a hand-over


class SyncClusterWaker:
    """The sync backend's wake-ups on a ``redis.RedisCluster`` (thread-safe)."""

    def __init__(
        self, cluster: Any, timeout: float, unavailable: tuple[type[BaseException], ...]
    ) -> None:
        self._cluster = cluster
        self._timeout = timeout
        self._unavailable = unavailable
        self._lock = threading.Lock()  # guards the two tables
        self._wakers: dict[str, SyncWaker] = {}
        self._homes: dict[tuple[str, str], SyncWaker] = {}

    def route(self, channel: str) -> SyncWaker | None:
        """The waker of the node serving ``channel`` (by the client's slot map)."""
        node = _owner_name(self._cluster, channel)
        if node is None or node.redis_connection is None:
            return None
        with self._lock:
            waker = self._wakers.get(node.name)
            if waker is None:
                waker = SyncWaker(
                    node.redis_connection, self._timeout, self._unavailable, sharded=True
                )
                self._wakers[node.name] = waker
        return waker

    def listen(self, channel: str, waiter: str) -> _RoutedThreadWaiter:
        """As ``SyncWaker.listen``, on the node that serves ``channel``."""
        routed = _RoutedThreadWaiter(self, channel, waiter)
        self.settle(routed)
        return routed

    def settle(self, routed: _RoutedThreadWaiter) -> None:
        """Listen for ``routed`` on the node serving its channel now."""
        channel, waiter = routed.channel, routed.waiter
        routed.home = waker = self.route(channel)
        if waker is None:
            return
        with self._lock:
            self._homes[channel, waiter] = waker
        try:
            routed.inner = waker.listen(channel, waiter)
        except BaseException:
            self._forget(channel, waiter)
            raise

    def join(self, channel: str, waiter: str) -> _RoutedThreadWaiter | None:
        """As ``SyncWaker.join``, on the node that serves ``channel``."""
        waker = self.route(channel)
        if waker is None:
            return None
        with self._lock:
            self._homes[channel, waiter] = waker  # before a hand can look for it
        joined = waker.join(channel, waiter)
        if joined is None:
            self._forget(channel, waiter)
            return None
        routed = _RoutedThreadWaiter(self, channel, waiter)
        routed.home, routed.inner = waker, joined
        return routed

    def part(self, channel: str, waiter: str) -> None:
        """As ``SyncWaker.part``, on the waker ``waiter`` listened on."""
        waker = self._forget(channel, waiter)
        if waker is not None:
            waker.part(channel, waiter)

    def hand(self, channel: str, waiter: str, fence: int | None) -> None:
        """As ``SyncWaker.hand``."""
        with self._lock:
            waker = self._homes.get((channel, waiter))
        if waker is not None:
            waker.hand(channel, waiter, fence)

    def _forget(self, channel: str, waiter: str) -> SyncWaker | None:
        with self._lock:
            return self._homes.pop((channel, waiter), None)

    def close(self) -> None:
        """Close every node's waker (the nodes' clients stay the Cluster client's)."""
        with self._lock:
            wakers, self._wakers = list(self._wakers.values()), {}
            self._homes.clear()
        for waker in wakers:
            waker.close()
