"""What ``Lock`` tells its ``on_event`` hook: waits and hold times, for metrics and logs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["LockEvent", "LockEventKind", "LockHook", "report"]

log = logging.getLogger("headway.lock")

LockEventKind = Literal["acquired", "not_acquired", "released", "lost", "errored"]
"""``acquired`` / ``not_acquired`` (the wait timed out) / ``released`` / ``lost`` (the
release found the lease lapsed or taken over) / ``errored`` (the backend failed)."""


@dataclass(frozen=True, slots=True)
class LockEvent:
    """One lock operation, as the ``on_event`` hook sees it.

    Attributes:
        kind: What happened (``LockEventKind``).
        resource: The lock's name.
        backend: The backend's kind (``"redis"``, ``"postgres"``, ...).
        waited: How long an acquire took, in seconds on the lock's clock (acquire
            events; else None).
        held: How long the lease was held until its release, in seconds (release
            events, when this ``Lock`` granted it; else None).
        fence: The lease's fencing token, when there is a lease.
    """

    kind: LockEventKind
    resource: str
    backend: str
    waited: float | None = None
    held: float | None = None
    fence: int | None = None


LockHook = Callable[[LockEvent], None]
"""The hook: sync, called inline after the operation with a ``LockEvent``. An exception
it raises is logged and swallowed: metrics must never change what the caller gets."""


def report(hook: LockHook, event: LockEvent) -> None:
    """Call ``hook`` with ``event``; its errors are logged, never raised."""
    try:
        hook(event)
    except Exception:
        log.exception("lock on_event hook failed")
