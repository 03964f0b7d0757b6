"""Who holds a lock, and how many wait: ``LockState``, read without taking anything.

A backend that can answer implements ``InspectableLockBackend`` (``inspect``); a
``for_mode`` view of a modal backend answers for its mode's family (a read-write lock
lists its readers or its writer; a semaphore its permit holders).

A holder is named by its fence, its time left and its *owner*: the label its ``Lock``
was given (``Lock(..., owner="worker-3")``). Lease tokens are never shown — a token
releases the lock, so whoever can inspect must not learn it.

The owner travels inside the lease token (``{hex(owner)}.{128 random bits}``), set for
the duration of one acquire by ``owned_by``: every backend that stores tokens stores
the owner with no change to its calls (docs/decisions/lock.md:
"Owners ride in the lease token").
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

from headway.lock.contract import LockBackend, SyncLockBackend
from headway.lock.lease import OWNER_PREFIX

__all__ = [
    "Holder",
    "InspectableLockBackend",
    "LockState",
    "SyncInspectableLockBackend",
    "check_owner",
    "current_owner",
    "owned_by",
    "owner_of",
]

HolderMode = Literal["exclusive", "read", "write", "permits"]

#: Owners are short printable labels: a host name, a pid, a worker id.
_OWNER = re.compile(r"[\x21-\x7e]{1,64}")


@dataclass(frozen=True, slots=True)
class Holder:
    """One live holder of a lock.

    Attributes:
        fence: The holder's fencing token.
        expires_in: Seconds until its lease runs out unrenewed; None where the store
            cannot tell (a session-bound lock lives as long as its connection).
        owner: Its ``Lock``'s ``owner`` label; None when it had none, or where the
            store keeps no token.
        mode: ``"exclusive"`` for a ``Lock``; ``"read"``, ``"write"`` or ``"permits"``
            for the modes of the lock family.
    """

    fence: int
    expires_in: float | None
    owner: str | None = None
    mode: HolderMode = "exclusive"


@dataclass(frozen=True, slots=True)
class LockState:
    """A lock's holders and waiters at one moment (it may change as soon as it is read).

    Attributes:
        resource: The lock's name.
        holders: The live holders, oldest fence first.
        waiting: How many requests wait in line.
    """

    resource: str
    holders: tuple[Holder, ...] = ()
    waiting: int = 0

    @property
    def held(self) -> bool:
        """Whether anybody holds the lock."""
        return bool(self.holders)


class InspectableLockBackend(LockBackend, Protocol):
    """A ``LockBackend`` that can tell who holds a lock (``LockState``)."""

    async def inspect(self, resource: str) -> LockState:
        """The state of ``resource``'s lock, read without taking or joining anything.

        Args:
            resource: The lock's name.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...


class SyncInspectableLockBackend(SyncLockBackend, Protocol):
    """The synchronous counterpart of ``InspectableLockBackend``."""

    def inspect(self, resource: str) -> LockState:
        """As ``InspectableLockBackend.inspect``, blocking.

        Args:
            resource: The lock's name.
        """
        ...


def check_owner(owner: str | None) -> str | None:
    """Validate an owner label: 1 to 64 printable ASCII characters, no spaces.

    Args:
        owner: The label, or None.

    Raises:
        TypeError: Not a str.
        ValueError: Empty, too long, or with spaces or control characters.
    """
    if owner is None:
        return None
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str, not {type(owner).__name__}")
    if not _OWNER.fullmatch(owner):
        raise ValueError(f"owner must be 1-64 printable ASCII characters, no spaces: {owner!r}")
    return owner


@contextlib.contextmanager
def owned_by(owner: str | None) -> Iterator[None]:
    """Tokens made in this context (by this task, or tasks it starts) carry ``owner``.

    Args:
        owner: A label accepted by ``check_owner``; None: no owner.
    """
    if owner is None:
        yield
        return
    reset = OWNER_PREFIX.set(owner.encode().hex() + ".")
    try:
        yield
    finally:
        OWNER_PREFIX.reset(reset)


def current_owner() -> str | None:
    """The owner of the acquire under way (set by ``owned_by``), or None.

    For stores that keep no token but can show a label (PostgreSQL's
    ``application_name``).
    """
    prefix = OWNER_PREFIX.get()
    return owner_of(prefix + "0") if prefix else None


def owner_of(token: str) -> str | None:
    """The owner a token carries, or None (a token made with no owner, or not ours).

    Args:
        token: A lease token as a store keeps it.
    """
    head, dot, _ = token.rpartition(".")
    if not dot:
        return None
    try:
        return check_owner(bytes.fromhex(head).decode("ascii"))
    except ValueError:  # not hex, not ASCII, or not an owner label
        return None
