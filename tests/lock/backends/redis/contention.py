"""Workers contending for locks on a Redis Cluster while its topology changes, and the
exact record of what they saw (for ``test_redis_cluster_topology``)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.cluster import RedisCluster

from headway import (
    BackendUnavailable,
    Lease,
    Lock,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisLockBackend,
)
from headway.lock.flow import Try

#: The documented errors a caller may see while the Cluster changes.
DOCUMENTED = (BackendUnavailable, LockNotAcquired, LockNotOwned, LockLost)


class CountedBackend(RedisLockBackend):
    """Counts the acquire scripts it sends; ``tried`` is set after each."""

    def __init__(self, client: Any, **options: Any) -> None:
        super().__init__(client, **options)
        self.attempts = 0
        self.tried = asyncio.Event()

    async def _try(self, resource: str, step: Try) -> Any:
        try:
            return await super()._try(resource, step)
        finally:
            self.attempts += 1
            self.tried.set()


@dataclass
class Ledger:
    """Every grant the workers saw, in the order they entered their critical sections."""

    fences: dict[str, list[int]] = field(default_factory=lambda: collections.defaultdict(list))
    inside: collections.Counter[str] = field(default_factory=collections.Counter)
    overlaps: int = 0  # entries while another holder of the same resource was inside
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    unexpected: list[BaseException] = field(default_factory=list)
    granted: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def grants(self) -> int:
        return sum(len(f) for f in self.fences.values())

    def enter(self, lease: Lease) -> None:
        self.overlaps += self.inside[lease.resource] > 0
        self.inside[lease.resource] += 1
        self.fences[lease.resource].append(lease.fence)
        self.granted.set()

    def leave(self, lease: Lease) -> None:
        self.inside[lease.resource] -= 1

    def failed(self, exc: Exception) -> None:
        if isinstance(exc, DOCUMENTED):
            self.errors[type(exc).__name__] += 1
        else:
            self.unexpected.append(exc)

    async def more(self, grants: int) -> None:
        """Return once ``grants`` more grants were seen."""
        target = self.grants + grants
        while self.grants < target:
            self.granted.clear()
            await self.granted.wait()

    def rising(self) -> bool:
        """Per resource, every fence is above all those granted before it."""
        return all(all(a < b for a, b in itertools.pairwise(f)) for f in self.fences.values())


async def _work(lock: Lock, ledger: Ledger, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            lease = await lock.acquire()
        except Exception as exc:
            ledger.failed(exc)
            await asyncio.sleep(0.05)  # a back-off while the Cluster heals, not a sync
            continue
        ledger.enter(lease)
        await asyncio.sleep(0)  # let another holder in, if the lock did not keep it out
        ledger.leave(lease)
        try:
            await lock.release(lease)
        except Exception as exc:
            ledger.failed(exc)


@contextlib.asynccontextmanager
async def contending(
    port: int, resources: list[str], per_resource: int, timeout: float = 1.0
) -> AsyncIterator[Ledger]:
    """Workers (each with a Cluster client and backend of its own, as processes have)
    looping on ``resources`` until the block ends."""
    ledger, stop = Ledger(), asyncio.Event()
    clients = [
        RedisCluster(host="127.0.0.1", port=port, socket_timeout=timeout)
        for _ in range(per_resource * len(resources))
    ]
    backends = [RedisLockBackend(client, timeout=timeout) for client in clients]
    locks = [
        Lock(backend, resources[i % len(resources)], ttl=5, timeout=3)
        for i, backend in enumerate(backends)
    ]
    tasks = [asyncio.create_task(_work(lock, ledger, stop)) for lock in locks]
    try:
        yield ledger
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for backend, client in zip(backends, clients, strict=True):
            await backend.aclose()
            await client.aclose()
