"""Read-write locks and semaphores on ZooKeeper: ``lock.modes``'s rule over a node queue.

Each request is an ephemeral sequential node in its family's folder (``paths``):
``read-``, ``write-`` or ``permit-<n>-`` then the token. The nodes in sequence order are
the queue, and a request is granted when ``modes.fits`` holds for the nodes ahead of it
(holders and waiters alike) and itself; the nodes behind never count. So a request waits
only on nodes ahead: no cycle, no deadlock (kazoo's ``ReadLock`` also counted writers
behind it, issue 649), and a grant is never taken back by a later arrival.

A waiter watches only what must go before it can fit, and looks again on each wake:

- a reader, the last writer ahead (readers fit with readers);
- a writer, the node just ahead (it fits only alone);
- a permit, the last ``n`` nodes ahead (``n`` the capacity): it fits once enough nodes
  ahead went, and those cannot all go while ``n`` of them remain, whatever the order
  in which holders release. The head of the line watches the holders; one further back
  the ``n`` just ahead of it, so a release wakes at most ``n`` waiters, never the herd.

The capacity is the newest request's ``n``, read from the newest node's name: every
waiter sees it in the same listing, with no extra read or write. The fence is the node's
``czxid``, as for the exclusive lock: unique, rising in queue order, and still rising
after the folder is deleted and made again.
"""

from __future__ import annotations

from headway._clock import Clock
from headway.lock.backends.zookeeper.paths import family_path, sequence
from headway.lock.backends.zookeeper.queue import ZooKeeperQueue
from headway.lock.backends.zookeeper.session import Session
from headway.lock.introspection import HolderMode
from headway.lock.modes import READ, WHOLE, WRITE, LockMode, fits, permits

__all__ = ["ZooKeeperModeBackend", "blockers"]

_LABELS = {"read": "read-", "write": "write-"}


def _weight(name: str) -> int:
    return WHOLE if name.startswith("write-") else 1


def _capacity(name: str) -> int:
    """The permits a ``permit-<n>-<token>-<sequence>`` node asked for."""
    field = name.split("-", 2)[1]
    return int(field) if field.isdigit() else 1


def blockers(mode: LockMode, mine: str, children: list[str]) -> list[str]:
    """The nodes ``mine`` (a request in ``mode``) waits for; [] if it is granted."""
    position = sequence(mine)
    queue = sorted((name for name in children if sequence(name) >= 0), key=sequence)
    ahead = [name for name in queue if sequence(name) < position]
    capacity = _capacity(queue[-1]) if mode.family == "permits" else mode.capacity
    if fits([], map(_weight, ahead), mode.weight, capacity):
        return []
    if mode.kind == "read":
        writers = [name for name in ahead if _weight(name) == WHOLE]
        return (writers or ahead)[-1:]
    if mode.kind == "write":
        return ahead[-1:]
    return ahead[-capacity:]


class ZooKeeperModeBackend(ZooKeeperQueue):
    """A ``ZooKeeperLockBackend`` holding resources in one ``LockMode`` (its session)."""

    def __init__(
        self, session: Session, prefix: str, mode: LockMode, clock: Clock | None = None
    ) -> None:
        super().__init__(session, clock)
        self.prefix = prefix
        self.mode = mode

    def __repr__(self) -> str:
        return f"ZooKeeperModeBackend({self.session.hosts!r}, {self.mode})"

    def _folder(self, resource: str) -> str:
        return family_path(self.prefix, resource, self.mode.family)

    def _label(self) -> str:
        return _LABELS.get(self.mode.kind) or f"permit-{self.mode.capacity}-"

    def _blockers(self, mine: str, children: list[str]) -> list[str]:
        return blockers(self.mode, mine, children)

    def _holds(self, name: str, children: list[str]) -> HolderMode | None:
        # Each node by its own mode, read from its name (the view's may differ).
        mode = WRITE if name.startswith("write-") else READ
        if name.startswith("permit-"):
            mode = permits(_capacity(name))
        return None if blockers(mode, name, children) else mode.kind
