"""Lock modes: shared (read), exclusive (write) and counted (permits).

Every mode is one rule, a FIFO queue of weighted requests on a resource: a request
is granted when the weights of the live holders, of every request still waiting
ahead of it, and its own fit within the resource's capacity.

- ``READ`` weighs 1 and ``WRITE`` weighs ``WHOLE``, in a capacity of ``WHOLE``:
  readers share, a writer is alone, and a waiting writer stops later readers from
  overtaking it; readers queued together behind a writer fit together, so they
  enter together once it leaves.
- ``permits(n)`` weighs 1 in a capacity of ``n``: a semaphore.

A resource's read-write lock, its semaphore and its exclusive ``Lock`` are three
independent locks (backends keep them apart). ``LockMode.weight`` and
``LockMode.capacity`` are what a backend needs; ``fits`` is the rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["READ", "WHOLE", "WRITE", "LockMode", "fits", "permits"]

#: The capacity of a read-write lock and a writer's weight: more readers than any
#: server holds at once, and small enough for every store's integers (Lua, SQL).
WHOLE = 1 << 30

ModeKind = Literal["read", "write", "permits"]


@dataclass(frozen=True, slots=True)
class LockMode:
    """A way to hold a resource: ``read``, ``write``, or one of ``capacity`` permits.

    ``family`` names the lock the mode belongs to ("rw" or "permits"): modes of one
    family exclude each other by weight; different families never meet. Backends
    receive modes (``ModalLockBackend.for_mode``); users take them from
    ``ReadWriteLock`` and ``Semaphore``.

    Attributes:
        kind: ``"read"``, ``"write"`` or ``"permits"``.
        capacity: What the holders' weights must fit in: 2**30 (``WHOLE``) for a
            read-write lock, the number of permits for a semaphore.
    """

    kind: ModeKind
    capacity: int = WHOLE

    @property
    def weight(self) -> int:
        """What a holder in this mode takes of the capacity."""
        return WHOLE if self.kind == "write" else 1

    @property
    def family(self) -> Literal["rw", "permits"]:
        """The lock this mode is a mode of."""
        return "permits" if self.kind == "permits" else "rw"


READ = LockMode("read")
WRITE = LockMode("write")


def permits(n: int) -> LockMode:
    """The mode of a semaphore with ``n`` permits (``n`` ≥ 1)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"permits must be an int, not {type(n).__name__}")
    if not 1 <= n <= WHOLE:
        raise ValueError(f"permits must be between 1 and {WHOLE}, got {n!r}")
    return LockMode("permits", n)


def fits(held: Iterable[int], ahead: Iterable[int], weight: int, capacity: int) -> bool:
    """The grant rule: the weights ``held`` (live holders) and ``ahead`` (requests
    still waiting before this one) plus ``weight`` fit in ``capacity``."""
    return sum(held) + sum(ahead) + weight <= capacity
