"""A queue of ephemeral sequential nodes as the primitives of a ``QueuedBackend``.

``ZooKeeperQueue`` does what every lock kind on ZooKeeper does alike: create the
request's node (listing its siblings in the same round trip), decide, watch the nodes
that must go first, delete the node at the lease's end, on release, or when its waiter
gives up, and sweep away nodes whose create reply was lost. A subclass says where its
nodes live (``_folder``), how they are named (``_label``), which of the nodes ahead a
request waits for (``_blockers``) and whether a released holder hands the lock to the
waiter of this session behind it (``succession``): the exclusive lock (``backend``) and
the mode views (``modal``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from abc import abstractmethod

from kazoo.exceptions import NoNodeError, SessionExpiredError

from headway._clock import Clock
from headway._errors import BackendUnavailable
from headway.lock import flow
from headway.lock.backends.zookeeper.bridge import WatchWaker
from headway.lock.backends.zookeeper.paths import sequence, token_of
from headway.lock.backends.zookeeper.session import Session
from headway.lock.contract import AsyncWaiter
from headway.lock.driver import QueuedBackend
from headway.lock.flow import Attempt, Try, parse_waiter
from headway.lock.introspection import Holder, HolderMode, LockState, owner_of
from headway.lock.lease import Lease, check_ttl

__all__ = ["Node", "ZooKeeperQueue"]


def _hint_ms() -> int:
    """A refused attempt's hint: wait up to the flow's cap; a watch ends the wait early."""
    return round(flow.WAIT_CAP * 1000)


class Node:
    """A request's node: its path, name, ``czxid`` (the fence) and the lease's end timer."""

    __slots__ = ("czxid", "name", "path", "timer")

    def __init__(self, path: str, czxid: int) -> None:
        self.path = path
        self.name = path.rpartition("/")[2]
        self.czxid = czxid
        self.timer: asyncio.TimerHandle | None = None


class ZooKeeperQueue(QueuedBackend):
    """The primitives over one ``Session``; see the module docstring for the hooks."""

    name = "zookeeper"
    #: Whether a released holder's deletion makes the waiter watching it the first in
    #: the queue (true of the exclusive lock, whose waiters each watch the one node just
    #: ahead): that waiter is then granted on the deletion's watch event, unlisted.
    succession = False

    def __init__(self, session: Session, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.session = session

    @abstractmethod
    def _folder(self, resource: str) -> str:
        """The folder holding the queue of ``resource``."""

    @abstractmethod
    def _label(self) -> str:
        """What a node's name starts with, before the token."""

    @abstractmethod
    def _blockers(self, mine: str, children: list[str]) -> list[str]:
        """The nodes ``mine`` waits for, [] if it is granted: it cannot be granted while
        they all remain, so it watches them and looks again when one goes."""

    def _last_blockers(self, mine: str, children: list[str], blockers: list[str]) -> bool:
        """Whether ``blockers`` are all that keep ``mine`` from the lock, so that their
        deletion alone grants it (nodes made later can never block it). False (the
        default): a wake-up only says to look again."""
        return False

    def _holds(self, name: str, children: list[str]) -> HolderMode | None:
        """How the request of node ``name`` holds the lock (its mode), None if it waits."""
        return None if self._blockers(name, children) else "exclusive"

    async def inspect(self, resource: str) -> LockState:
        """Who holds ``resource``'s lock, and how many wait (``InspectableLockBackend``).

        The folder's request nodes, read in one listing: those granted by the queue's
        rule hold (fence: the node's ``czxid``; owner: read from the token in its name),
        the others wait. ``expires_in`` is None: a lease's end is its holder's own
        timer, and the server only keeps the node until the holder's session expires
        (``session_timeout`` after it was last heard).

        Args:
            resource: The lock's name.
        """
        await self.session.ready()
        folder = self._folder(resource)
        children = [name for name in await self._children(folder) if sequence(name) >= 0]
        held = [(name, mode) for name in children if (mode := self._holds(name, children))]
        client = self.session.client
        calls = [client.exists_async(f"{folder}/{name}") for name, _ in held]
        stats = [await self.session.call(call) for call in calls]
        holders = [
            Holder(stat.czxid, None, owner_of(token_of(name)), mode)
            for (name, mode), stat in zip(held, stats, strict=True)
            if stat is not None  # released as we looked
        ]
        holders.sort(key=lambda holder: holder.fence)
        return LockState(resource, tuple(holders), len(children) - len(held))

    def _check(self, ttl: float) -> None:
        if check_ttl(ttl) > self.session.session_ms:
            raise ValueError(
                f"ttl={ttl!r} s is longer than the ZooKeeper session timeout "
                f"({self.session.session_ms / 1000:g} s), which bounds every lease: "
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

    async def _children(self, folder: str) -> list[str]:
        try:
            children: list[str] = await self.session.call(
                self.session.client.get_children_async(folder)
            )
        except NoNodeError:
            return []
        return children

    async def _enqueue(self, folder: str, token: str) -> tuple[Node, list[str]]:
        """Create ``token``'s node, and list the queue in the same round trip."""
        client = self.session.client
        create = client.create_async(
            f"{folder}/{self._label()}{token}-", b"", ephemeral=True, sequence=True,
            makepath=True, include_data=True,
        )  # fmt: skip
        listing = client.get_children_async(folder)  # behind the create, in order
        try:
            path, stat = await self.session.call(create)
        except BaseException:
            self._sweep(folder, token)  # the node may exist: find it and delete it
            raise
        node = self.session.nodes[token] = Node(path, stat.czxid)
        try:
            children: list[str] = await self.session.call(listing)
        except NoNodeError:  # the create made the folder after the listing looked
            children = []
        if node.name not in children:
            children = await self._children(folder)
        return node, children

    async def _try(self, resource: str, step: Try) -> Attempt:
        await self.session.ready()
        loop = asyncio.get_running_loop()
        sent = loop.time()  # the node outlives the lease counted from here
        folder = self._folder(resource)
        node = self.session.nodes.get(step.token)
        waker = self.session.wakers.get(step.token)
        if node is None:
            node, children = await self._enqueue(folder, step.token)
        elif waker is not None and waker.granted() and self._vouched(waker, sent) >= step.ttl_ms:
            # What it waited for was deleted, and nothing made later goes first: granted,
            # one listing sooner than a look would tell, if the session is sure to outlive
            # the lease without a request now (else the listing proves it alive).
            self._arm(step.token, node, sent + step.ttl_ms / 1000, loop)
            return Attempt(True, fence=node.czxid)
        else:
            children = await self._children(folder)
        while True:
            if node.name not in children:  # the session ended, and the node with it
                self._forget(step.token)
                node, children = await self._enqueue(folder, step.token)
                continue
            blockers = self._blockers(node.name, children)
            if not blockers:
                self._arm(step.token, node, sent + step.ttl_ms / 1000, loop)
                return Attempt(True, fence=node.czxid)
            if not step.waiter:  # a single attempt keeps no place
                await self._drop(step.token)
                return Attempt(False, pttl_ms=_hint_ms())
            if waker is None:  # not listening yet: the driver listens, then tries again
                return Attempt(False, pttl_ms=_hint_ms())
            last = self._last_blockers(node.name, children, blockers)
            waker.expect({f"{folder}/{name}" for name in blockers} if last else None, sent)
            self._follow(waker, f"{folder}/{blockers[0]}" if self.succession else None)
            if await self._watch(folder, blockers, waker):
                return Attempt(False, pttl_ms=_hint_ms())
            children = await self._children(folder)  # one of them left meanwhile

    async def _watch(self, folder: str, blockers: list[str], waker: WatchWaker) -> bool:
        """Watch every blocker (one round trip); False if one is gone already."""
        client = self.session.client
        calls = [client.exists_async(f"{folder}/{name}", watch=waker.fire) for name in blockers]
        stats = [await self.session.call(call) for call in calls]
        return all(stat is not None for stat in stats)

    def _vouched(self, waker: WatchWaker, now: float) -> int:
        """How long (ms) the session is sure to live from ``now``: its timeout past the
        server's last request from it (``waker.heard``); 0 if that may have run out."""
        return max(0, math.floor(self.session.session_ms - (now - waker.heard) * 1000))

    def _follow(self, waker: WatchWaker, path: str | None) -> None:
        """Record that ``waker`` waits on the node at ``path`` alone (None: on nothing now)."""
        successors = self.session.successors
        if waker.follows is not None and successors.get(waker.follows) is waker:
            del successors[waker.follows]
        waker.follows = path
        if path is not None:
            successors[path] = waker

    def _hand_over(self, node: Node) -> None:
        """``node``, held, is about to be deleted: once it is, the waiter of this session
        watching it is first. A holder's node has nothing ahead of it, and the waiter
        saw no node between the two when it chose which to watch (sequences only rise),
        so that deletion alone grants it; ``_drop``, a waiter leaving, proves nothing."""
        successor = self.session.successors.pop(node.path, None)
        if successor is not None:
            successor.follows = None
            # Heard by the server after now: the delete is sent right after this.
            successor.expect({node.path}, asyncio.get_running_loop().time())

    def _arm(self, token: str, node: Node, until: float, loop: asyncio.AbstractEventLoop) -> None:
        """Delete ``node`` at ``until`` (loop time) unless renewed: the lease's end."""
        if node.timer is not None:
            node.timer.cancel()
        node.timer = loop.call_at(until, self._expire, token)

    def _expire(self, token: str) -> None:
        node = self._forget(token)
        if node is not None:
            self._sweep(node.path.rpartition("/")[0], token)

    def _forget(self, token: str) -> Node | None:
        node = self.session.nodes.pop(token, None)
        if node is not None and node.timer is not None:
            node.timer.cancel()
        return node

    async def _drop(self, token: str) -> None:
        """Delete ``token``'s node; if ZooKeeper cannot be asked now, later."""
        node = self._forget(token)
        if node is None:
            return
        try:
            await self.session.call(self.session.client.delete_async(node.path))
        except NoNodeError:
            pass
        except BackendUnavailable:
            self._sweep(node.path.rpartition("/")[0], token)

    async def _release(self, resource: str, token: str) -> bool:
        node = self._forget(token)
        if node is None:  # never ours, or its lease ran out
            return False
        self._hand_over(node)
        try:
            await self.session.call(self.session.client.delete_async(node.path))
        except NoNodeError:
            return False  # the session ended, and the node with it
        except BaseException:
            self._sweep(node.path.rpartition("/")[0], token)
            raise
        return True

    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        node = self.session.nodes.get(token)
        if node is None:
            return False
        loop = asyncio.get_running_loop()
        sent = loop.time()
        try:
            # Answered only on a live session: the server keeps it (and the node)
            # session_timeout >= ttl past this request.
            stat = await self.session.call(self.session.client.exists_async(node.path))
        except BackendUnavailable as exc:
            if isinstance(exc.__cause__, SessionExpiredError):
                self._forget(token)
                return False
            raise
        if stat is None or self.session.nodes.get(token) is not node:
            self._forget(token)
            return False
        self._arm(token, node, sent + ttl_ms / 1000, loop)
        return True

    async def _leave(self, resource: str, waiter: str) -> None:
        await self._drop(parse_waiter(waiter)[0])

    def _join(self, resource: str, waiter: str) -> AsyncWaiter | None:
        # Listening needs no I/O here (the watch is set by the refused attempt), so a
        # waiter listens before its first attempt and never needs the retry after it.
        waker = WatchWaker(asyncio.get_running_loop())
        self.session.wakers[parse_waiter(waiter)[0]] = waker
        return waker

    async def _listen(self, resource: str, waiter: str) -> AsyncWaiter:
        waker = self._join(resource, waiter)
        assert waker is not None
        return waker

    async def _unlisten(self, resource: str, waiter: str) -> None:
        waker = self.session.wakers.pop(parse_waiter(waiter)[0], None)
        if waker is not None:
            self._follow(waker, None)

    def _sweep(self, folder: str, token: str) -> None:
        """Delete ``token``'s nodes in the background, retrying while ZooKeeper is away."""
        task = asyncio.get_running_loop().create_task(self._sweeping(folder, token))
        self.session.sweeps.add(task)
        task.add_done_callback(self.session.sweeps.discard)

    async def _sweeping(self, folder: str, token: str) -> None:
        # Past twice the session timeout the session is gone, and its nodes with it.
        loop = asyncio.get_running_loop()
        give_up, delay = loop.time() + 2 * self.session.session_ms / 1000, 0.05
        while loop.time() < give_up:
            try:
                # Listed after the lost request was sent, so a node it made is listed.
                for name in await self._children(folder):
                    current = self.session.nodes.get(token)  # a later attempt's node stays
                    if token_of(name) == token and (current is None or current.name != name):
                        with contextlib.suppress(NoNodeError):
                            await self.session.call(
                                self.session.client.delete_async(f"{folder}/{name}")
                            )
                return
            except BackendUnavailable:
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
