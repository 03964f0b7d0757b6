"""Wake-ups on a Redis Cluster: sharded channels, one waker per primary.

A lock's release publishes on its sharded channel (``SPUBLISH``), which only
the primary that owns the lock's slot (and its replicas) carry; a classic
``PUBLISH`` is copied to every node of the Cluster over its bus. So the waiters
of one backend listen on one connection per primary: each channel on the node
that owns its slot now (the client's slot map), through a ``Waker`` (or a
``SyncWaker``) of that node's own. redis-py's Cluster pub/sub reads its nodes
in turn, each with the whole timeout, so a message on one node waits behind a
quiet other: hence a reader per node, ours.

A waiter is parted on the waker it listened on, even if the slot moved since.
When a slot moves, its node ends the subscriptions (``sunsubscribe``) and its
waker wakes their waiters, who try again; the next listener subscribes on the
slot's new owner. A node that dies wakes its waiters likewise. Until then a
waiter waits out its bound (``WAIT_CAP``): slower, never unsafe.
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


class ClusterWaker:
    """The async backend's wake-ups on a ``redis.asyncio.RedisCluster``."""

    def __init__(self, cluster: Any, timeout: float) -> None:
        self._cluster = cluster
        self._timeout = timeout
        self._wakers: dict[str, tuple[Waker, Any]] = {}  # node name -> waker, its client
        self._homes: dict[tuple[str, str], Waker] = {}  # (channel, waiter) -> its waker

    def _waker(self, channel: str) -> Waker | None:
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

    async def listen(self, channel: str, waiter: str) -> _EventWaiter:
        """As ``Waker.listen``, on the node that owns ``channel``."""
        waker = self._waker(channel)
        if waker is None:
            return _EventWaiter(Wake(asyncio.Event()))  # nobody wakes it: it waits its bound
        self._homes[channel, waiter] = waker
        try:
            return await waker.listen(channel, waiter)
        except BaseException:
            self._homes.pop((channel, waiter), None)
            raise

    def join(self, channel: str, waiter: str) -> _EventWaiter | None:
        """As ``Waker.join``, on the node that owns ``channel``."""
        waker = self._waker(channel)
        joined = waker.join(channel, waiter) if waker is not None else None
        if waker is not None and joined is not None:
            self._homes[channel, waiter] = waker
        return joined

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

    def _waker(self, channel: str, waiter: str) -> SyncWaker | None:
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
            self._homes[channel, waiter] = waker
        return waker

    def listen(self, channel: str, waiter: str) -> _ThreadWaiter:
        """As ``SyncWaker.listen``, on the node that owns ``channel``."""
        waker = self._waker(channel, waiter)
        if waker is None:
            return _ThreadWaiter(Wake(threading.Event()))  # it waits its bound
        try:
            return waker.listen(channel, waiter)
        except BaseException:
            self._forget(channel, waiter)
            raise

    def join(self, channel: str, waiter: str) -> _ThreadWaiter | None:
        """As ``SyncWaker.join``, on the node that owns ``channel``."""
        waker = self._waker(channel, waiter)
        joined = waker.join(channel, waiter) if waker is not None else None
        if joined is None:
            self._forget(channel, waiter)
        return joined

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
