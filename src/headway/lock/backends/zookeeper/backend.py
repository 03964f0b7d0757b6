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

``for_mode`` offers read-write locks and semaphores on the same session: the same
recipe with a weighted grant rule (``modal``). The queue's mechanics are in ``queue``,
the client in ``session``.
"""

from __future__ import annotations

from typing import Any

from headway._clock import Clock
from headway.lock.backends.zookeeper.modal import ZooKeeperModeBackend
from headway.lock.backends.zookeeper.paths import check_prefix, resource_path, sequence
from headway.lock.backends.zookeeper.queue import ZooKeeperQueue
from headway.lock.backends.zookeeper.session import Session
from headway.lock.modes import LockMode, ModeKind

__all__ = ["ZooKeeperLockBackend"]


class ZooKeeperLockBackend(ZooKeeperQueue):
    """Locks on a ZooKeeper ensemble (kazoo client), fenced by ``czxid``.

    The session is the lease. Other keyword arguments go to ``KazooClient``
    (``auth_data``, ...). Offers every mode: ``ReadWriteLock`` and ``Semaphore`` work
    over it too.

    Args:
        hosts: Kazoo's connection string (``"zk1:2181,zk2:2181/chroot"``); default
            ``"127.0.0.1:2181"``.
        session_timeout: How long a holder that stopped talking keeps the lock, in
            seconds, and the longest ``ttl`` accepted; default 30.0.
        timeout: Bounds every request, in seconds (> 0): an ensemble that has no
            quorum or cannot be reached raises ``BackendUnavailable`` within it;
            default 2.0.
        prefix: The absolute path every lock lives under; default
            ``"/headway/locks"``.
        clock: The monotonic clock of lease deadlines and waits; default None:
            ``time.monotonic``.

    Raises:
        ValueError: A bad ``prefix``, ``session_timeout`` or ``timeout``.
    """

    name = "zookeeper"
    succession = True
    modes: frozenset[ModeKind] = frozenset({"read", "write", "permits"})

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
        super().__init__(Session(hosts, session_timeout, timeout, options), clock)
        self.prefix = check_prefix(prefix)
        self.hosts = hosts
        self.session_ms = self.session.session_ms
        self.timeout = timeout
        self.client = self.session.client

    def __repr__(self) -> str:
        return f"ZooKeeperLockBackend({self.hosts!r}, prefix={self.prefix!r})"

    def for_mode(self, mode: LockMode) -> ZooKeeperModeBackend:
        """This backend's locks in ``mode`` (see ``ModalLockBackend.for_mode``), on its session."""
        return ZooKeeperModeBackend(self.session, self.prefix, mode, self.clock)

    def _folder(self, resource: str) -> str:
        return resource_path(self.prefix, resource)

    def _label(self) -> str:
        return ""

    def _blockers(self, mine: str, children: list[str]) -> list[str]:
        # The waiter just ahead (FIFO, no herd); the lowest node owns the lock.
        position = sequence(mine)
        earlier = [name for name in children if 0 <= sequence(name) < position]
        return [max(earlier, key=sequence)] if earlier else []

    def _last_blockers(self, mine: str, children: list[str], blockers: list[str]) -> bool:
        # The only node ahead: once it goes, ours is the lowest (sequences only rise).
        return len(blockers) == sum(1 for name in children if 0 <= sequence(name) < sequence(mine))

    async def aclose(self) -> None:
        """End the session (the server deletes its nodes at once) and stop kazoo's threads."""
        await self.session.aclose()
