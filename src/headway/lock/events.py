"""What ``Lock`` tells its ``on_event`` hook: waits and hold times, for metrics and logs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["LockEvent", "LockEventKind", "LockHook", "report"]

log = logging.getLogger("headway.lock")

#: ``acquired`` / ``not_acquired`` (the wait timed out) / ``released`` / ``lost`` (the
#: release found the lease lapsed or taken over) / ``errored`` (the backend failed).
LockEventKind = Literal["acquired", "not_acquired", "released", "lost", "errored"]


@dataclass(frozen=True, slots=True)
class LockEvent:
    """One lock operation, as the ``on_event`` hook sees it.

    ``waited`` is how long an acquire took (acquire events), ``held`` how long the
    lease was held until its release (release events, when this ``Lock`` granted it);
    both in seconds on the lock's clock. ``backend`` is the backend's kind
    (``"redis"``, ``"postgres"``, ...).
    """

    kind: LockEventKind
    resource: str
    backend: str
    waited: float | None = None
    held: float | None = None
    fence: int | None = None


#: The hook: sync, called inline after the operation. An exception it raises is logged
#: and swallowed: metrics must never change what the caller gets.
LockHook = Callable[[LockEvent], None]


def report(hook: LockHook, event: LockEvent) -> None:
    """Call ``hook`` with ``event``; its errors are logged, never raised."""
    try:
        hook(event)
    except Exception:
        log.exception("lock on_event hook failed")
