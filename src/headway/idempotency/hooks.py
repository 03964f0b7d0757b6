"""Calling the ``on_event`` hook: sync or async, and never able to change an answer."""

from __future__ import annotations

import inspect
import logging
from typing import Literal

from headway.idempotency.events import IdempotencyEvent, IdempotencyEventKind, IdempotencyHook

__all__ = ["emit"]

log = logging.getLogger("headway.idempotency")


async def emit(
    hook: IdempotencyHook | None,
    kind: IdempotencyEventKind,
    source: Literal["http", "function"],
    caller: str,
    key: str,
    fence: int | None = None,
) -> None:
    """Tell ``hook`` about one event of ``source``; its errors are logged and swallowed."""
    if hook is None:
        return
    try:
        result = hook(IdempotencyEvent(kind, caller, key, source, fence))
        if inspect.isawaitable(result):
            await result
    except Exception:
        # Metrics and logs must never change what the caller gets.
        log.exception("idempotency on_event hook failed on %r", kind)
