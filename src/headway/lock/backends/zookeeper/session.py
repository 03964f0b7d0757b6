"""One kazoo client, one ZooKeeper session: what a backend and its mode views share.

Every queue of a ``ZooKeeperLockBackend`` (the exclusive lock, the read-write locks,
the semaphores) keeps its nodes in this one session, so they live and die with it,
and its tokens, nodes and wake-ups in this one table, so a lease taken through one
view of the backend can be released through another.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient

from headway._errors import BackendUnavailable
from headway.lock.backends.zookeeper.bridge import (
    UNAVAILABLE,
    InlineHandler,
    WatchWaker,
    settled,
    unavailable,
)
from headway.lock.lease import check_timeout, check_ttl

if TYPE_CHECKING:
    from headway.lock.backends.zookeeper.queue import Node

__all__ = ["Session"]


class Session:
    """The client of a ``ZooKeeperLockBackend`` and the nodes its session holds."""

    def __init__(
        self, hosts: str, session_timeout: float, timeout: float, options: dict[str, Any]
    ) -> None:
        self.session_ms = check_ttl(session_timeout)
        if check_timeout(timeout) <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout!r}")
        self.timeout = timeout
        self.hosts = hosts
        # A handler of the caller's is kept; ours settles replies one thread hop sooner.
        options.setdefault("handler", InlineHandler())
        self.client = KazooClient(hosts=hosts, timeout=session_timeout, **options)
        self.live: threading.Event | None = None
        self.nodes: dict[str, Node] = {}  # token -> its node, waiting or holding
        self.wakers: dict[str, WatchWaker] = {}  # token -> its waiter's wake-ups
        # A watched node's path -> the waiter whose lock its deletion may hand over.
        self.successors: dict[str, WatchWaker] = {}
        self.sweeps: set[asyncio.Task[None]] = set()

    async def ready(self) -> None:
        """Start the session on first use, waiting for it at most ``timeout``."""
        if self.live is None:
            self.live = self.client.start_async()
        live = self.live
        if not live.is_set():
            # Only until the first session is up (kazoo reconnects by itself after that):
            # later requests wait in kazoo's queue, bounded by ``timeout``.
            loop = asyncio.get_running_loop()
            if not await loop.run_in_executor(None, live.wait, self.timeout):
                raise BackendUnavailable(
                    f"ZooKeeper at {self.hosts!r} not reached within {self.timeout:g} s",
                    backend="zookeeper",
                )

    async def call(self, result: Any) -> Any:
        """Await one kazoo request, at most ``timeout``."""
        future = settled(result, asyncio.get_running_loop())
        try:
            async with asyncio.timeout(self.timeout):
                return await future
        except UNAVAILABLE as exc:
            raise unavailable(exc, self.timeout) from exc

    async def aclose(self) -> None:
        """End the session (the server deletes its nodes at once) and stop kazoo's threads."""
        for node in self.nodes.values():
            if node.timer is not None:
                node.timer.cancel()
        self.nodes.clear()
        for task in list(self.sweeps):
            task.cancel()
        await asyncio.gather(*self.sweeps, return_exceptions=True)
        if self.live is not None:
            self.live = None
            await asyncio.get_running_loop().run_in_executor(None, self._stop)

    def _stop(self) -> None:
        self.client.stop()
        self.client.close()
