"""The ZooKeeper lock backend: ephemeral sequential nodes, the lowest one owns.

The recipe of ZooKeeper's own lock (and kazoo's ``Lock``), as the primitives of a
``QueuedBackend``:

- **A place in the queue** is an ephemeral sequential node
  ``<prefix>/<resource>/<token>-<sequence>`` (``paths``), created with the listing of
  its siblings sent right behind it: one round trip. The owner is the node with the
  lowest sequence; a waiter watches only the node just ahead of it (FIFO, no herd) and
  looks again when that node goes.
- **The fencing token** is the owner node's ``czxid``, the transaction id that created
  it: ensemble-wide, increasing, with the leader's epoch in its high bits. An owner's
  node was created after every earlier owner's (it queued behind them), so its
  ``czxid`` is larger, even if the resource's folder was deleted and recreated, which
  resets the sequence suffix.
- **The lease.** An ephemeral node lives as long as the client's session, and the
  session lives while the client talks to the ensemble (kazoo sends heartbeats from its
  own thread): a holder that stops (crashed, paused, cut off) loses its node
  ``session_timeout`` after it was last heard. A live holder that stops renewing loses
  it after ``ttl``: this backend deletes the node then. ``ttl`` may not exceed
  ``session_timeout``, so a lease never outlasts what the server guarantees: every
  grant and renewal is a request the server answers only on a live session, and the
  server keeps the session ``session_timeout`` >= ``ttl`` past it.
- **Session loss** deletes every node of the session on the server; the holder's next
  renewal finds its node gone (or its lease has run out first), and ``hold()`` cancels
  the block with ``LockLost``.

A request whose reply is lost may still create a node later; such nodes are found by
their token and deleted in the background, as are nodes a release could not delete.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, SessionExpiredError

from headway._clock import Clock
from headway._errors import BackendUnavailable
from headway.lock.backends.zookeeper.bridge import UNAVAILABLE, WatchWaker, settled, unavailable
from headway.lock.backends.zookeeper.paths import (
    check_prefix,
    resource_path,
    sequence,
    token_of,
)
from headway.lock.contract import AsyncWaiter
from headway.lock.driver import QueuedBackend
from headway.lock.flow import Attempt, Try, parse_waiter
from headway.lock.lease import Lease, check_timeout, check_ttl

__all__ = ["ZooKeeperLockBackend"]

#: A refused attempt's hint: wait up to the flow's cap; the watch ends the wait early.
_HINT_MS = 500


class _Node:
    __slots__ = ("czxid", "name", "path", "timer")

    def __init__(self, path: str, czxid: int) -> None:
        self.path = path
        self.name = path.rpartition("/")[2]
        self.czxid = czxid
        self.timer: asyncio.TimerHandle | None = None


def _ahead(node: _Node, children: list[str]) -> str | None:
    """The waiter just ahead of ``node`` in the queue, or None if ``node`` owns the lock."""
    mine = sequence(node.name)
    earlier = [name for name in children if 0 <= sequence(name) < mine]
    return max(earlier, key=sequence) if earlier else None


class ZooKeeperLockBackend(QueuedBackend):
    """Locks on a ZooKeeper ensemble (kazoo client), fenced by ``czxid``.

    ``hosts`` is kazoo's connection string (``"zk1:2181,zk2:2181/chroot"``). The session
    is the lease: ``session_timeout`` (s) is how long a holder that stopped talking keeps
    the lock, and the longest ``ttl`` accepted. ``timeout`` bounds every request: an
    ensemble that has no quorum or cannot be reached raises ``BackendUnavailable``
    within it. Other keyword arguments go to ``KazooClient`` (``auth_data``, ...).
    """

    name = "zookeeper"

    def __init__(
        self,
        hosts: str = "127.0.0.1:2181",
        *,
        session_timeout: float = 30.0,
        timeout: float = 2.0,
        prefix: str = "/headway/locks",
        clock: Clock | None = None,
        **options: Any,
    ) -> None:
        super().__init__(clock)
        self.session_ms = check_ttl(session_timeout)
        if check_timeout(timeout) <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout!r}")
        self.timeout = timeout
        self.prefix = check_prefix(prefix)
        self.hosts = hosts
        self.client = KazooClient(hosts=hosts, timeout=session_timeout, **options)
        self._live: threading.Event | None = None
        self._nodes: dict[str, _Node] = {}  # token -> its node, waiting or holding
        self._wakers: dict[str, WatchWaker] = {}  # token -> its waiter's wake-ups
        self._sweeps: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"ZooKeeperLockBackend({self.hosts!r}, prefix={self.prefix!r})"

    def _check(self, ttl: float) -> None:
        if check_ttl(ttl) > self.session_ms:
            raise ValueError(
                f"ttl={ttl!r} s is longer than the ZooKeeper session timeout "
                f"({self.session_ms / 1000:g} s), which bounds every lease: "
                "lower the ttl or raise session_timeout"
            )

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Acquire ``resource`` (see ``LockBackend.acquire``); ``ttl`` <= the session timeout."""
        self._check(ttl)
        return await super().acquire(resource, ttl, timeout)

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        """Extend ``lease`` to ``ttl`` s from now; ``ttl`` <= the session timeout."""
        self._check(ttl)
        return await super().extend(lease, ttl)

    async def _ready(self) -> None:
        """Start the session on first use, waiting for it at most ``timeout``."""
        if self._live is None:
            self._live = self.client.start_async()
        live = self._live
        if not live.is_set():
            # Only until the first session is up (kazoo reconnects by itself after that):
            # later requests wait in kazoo's queue, bounded by ``timeout``.
            loop = asyncio.get_running_loop()
            if not await loop.run_in_executor(None, live.wait, self.timeout):
                raise BackendUnavailable(
                    f"ZooKeeper at {self.hosts!r} not reached within {self.timeout:g} s",
                    backend="zookeeper",
                )

    async def _call(self, result: Any) -> Any:
        """Await one kazoo request, at most ``timeout``."""
        future = settled(result, asyncio.get_running_loop())
        try:
            async with asyncio.timeout(self.timeout):
                return await future
        except UNAVAILABLE as exc:
            raise unavailable(exc, self.timeout) from exc

    async def _children(self, folder: str) -> list[str]:
        try:
            children: list[str] = await self._call(self.client.get_children_async(folder))
        except NoNodeError:
            return []
        return children

    async def _enqueue(self, folder: str, token: str) -> tuple[_Node, list[str]]:
        """Create ``token``'s node, and list the queue in the same round trip."""
        create = self.client.create_async(
            f"{folder}/{token}-", b"", ephemeral=True, sequence=True, makepath=True,
            include_data=True,
        )  # fmt: skip
        listing = self.client.get_children_async(folder)  # behind the create, in order
        try:
            path, stat = await self._call(create)
        except BaseException:
            self._sweep(folder, token)  # the node may exist: find it and delete it
            raise
        node = self._nodes[token] = _Node(path, stat.czxid)
        try:
            children: list[str] = await self._call(listing)
        except NoNodeError:  # the create made the folder after the listing looked
            children = []
        if node.name not in children:
            children = await self._children(folder)
        return node, children

    async def _try(self, resource: str, step: Try) -> Attempt:
        await self._ready()
        loop = asyncio.get_running_loop()
        sent = loop.time()  # the node outlives the lease counted from here
        folder = resource_path(self.prefix, resource)
        node = self._nodes.get(step.token)
        if node is None:
            node, children = await self._enqueue(folder, step.token)
        else:
            children = await self._children(folder)
        while True:
            if node.name not in children:  # the session ended, and the node with it
                self._forget(step.token)
                node, children = await self._enqueue(folder, step.token)
                continue
            ahead = _ahead(node, children)
            if ahead is None:
                self._arm(step.token, node, sent + step.ttl_ms / 1000, loop)
                return Attempt(True, fence=node.czxid)
            if not step.waiter:  # a single attempt keeps no place
                await self._drop(step.token)
                return Attempt(False, pttl_ms=_HINT_MS)
            waker = self._wakers.get(step.token)
            if waker is None:  # not listening yet: the driver listens, then tries again
                return Attempt(False, pttl_ms=_HINT_MS)
            watch = self.client.exists_async(f"{folder}/{ahead}", watch=waker.fire)
            if await self._call(watch) is not None:
                return Attempt(False, pttl_ms=_HINT_MS)
            children = await self._children(folder)  # the one ahead left meanwhile

    def _arm(self, token: str, node: _Node, until: float, loop: asyncio.AbstractEventLoop) -> None:
        """Delete ``node`` at ``until`` (loop time) unless renewed: the lease's end."""
        if node.timer is not None:
            node.timer.cancel()
        node.timer = loop.call_at(until, self._expire, token)

    def _expire(self, token: str) -> None:
        node = self._forget(token)
        if node is not None:
            self._sweep(node.path.rpartition("/")[0], token)

    def _forget(self, token: str) -> _Node | None:
        node = self._nodes.pop(token, None)
        if node is not None and node.timer is not None:
            node.timer.cancel()
        return node

    async def _drop(self, token: str) -> None:
        """Delete ``token``'s node; if ZooKeeper cannot be asked now, later."""
        node = self._forget(token)
        if node is None:
            return
        try:
            await self._call(self.client.delete_async(node.path))
        except NoNodeError:
            pass
        except BackendUnavailable:
            self._sweep(node.path.rpartition("/")[0], token)

    async def _release(self, resource: str, token: str) -> bool:
        node = self._forget(token)
        if node is None:  # never ours, or its lease ran out
            return False
        try:
            await self._call(self.client.delete_async(node.path))
        except NoNodeError:
            return False  # the session ended, and the node with it
        except BaseException:
            self._sweep(node.path.rpartition("/")[0], token)
            raise
        return True

    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        node = self._nodes.get(token)
        if node is None:
            return False
        loop = asyncio.get_running_loop()
        sent = loop.time()
        try:
            # Answered only on a live session: the server keeps it (and the node)
            # session_timeout >= ttl past this request.
            stat = await self._call(self.client.exists_async(node.path))
        except BackendUnavailable as exc:
            if isinstance(exc.__cause__, SessionExpiredError):
                self._forget(token)
                return False
            raise
        if stat is None or self._nodes.get(token) is not node:
            self._forget(token)
            return False
        self._arm(token, node, sent + ttl_ms / 1000, loop)
        return True

    async def _leave(self, resource: str, waiter: str) -> None:
        await self._drop(parse_waiter(waiter)[0])

    def _join(self, resource: str, waiter: str) -> AsyncWaiter | None:
        # Listening needs no I/O here (the watch is set by the refused attempt), so a
        # waiter listens before its first attempt and never needs the retry after it.
        waker = self._wakers[parse_waiter(waiter)[0]] = WatchWaker(asyncio.get_running_loop())
        return waker

    async def _listen(self, resource: str, waiter: str) -> AsyncWaiter:
        waker = self._join(resource, waiter)
        assert waker is not None
        return waker

    async def _unlisten(self, resource: str, waiter: str) -> None:
        self._wakers.pop(parse_waiter(waiter)[0], None)

    def _sweep(self, folder: str, token: str) -> None:
        """Delete ``token``'s nodes in the background, retrying while ZooKeeper is away."""
        task = asyncio.get_running_loop().create_task(self._sweeping(folder, token))
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    async def _sweeping(self, folder: str, token: str) -> None:
        # Past twice the session timeout the session is gone, and its nodes with it.
        loop = asyncio.get_running_loop()
        give_up, delay = loop.time() + 2 * self.session_ms / 1000, 0.05
        while loop.time() < give_up:
            try:
                # Listed after the lost request was sent, so a node it made is listed.
                for name in await self._children(folder):
                    current = self._nodes.get(token)  # a later attempt's node stays
                    if token_of(name) == token and (current is None or current.name != name):
                        with contextlib.suppress(NoNodeError):
                            await self._call(self.client.delete_async(f"{folder}/{name}"))
                return
            except BackendUnavailable:
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)

    async def aclose(self) -> None:
        """End the session (the server deletes its nodes at once) and stop kazoo's threads."""
        for node in self._nodes.values():
            if node.timer is not None:
                node.timer.cancel()
        self._nodes.clear()
        for task in list(self._sweeps):
            task.cancel()
        await asyncio.gather(*self._sweeps, return_exceptions=True)
        if self._live is not None:
            self._live = None
            await asyncio.get_running_loop().run_in_executor(None, self._stop)

    def _stop(self) -> None:
        self.client.stop()
        self.client.close()
