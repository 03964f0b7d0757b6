"""``portal()``: one event loop in a daemon thread, where sync idempotent functions
keep their records.

The store and the lock are async (SQLAlchemy's async engine, the async lock
backends). A sync function's wrapper runs their calls here and waits for them, while
the function's body runs in the caller's own thread; so plain threads, with no event
loop of their own, can call it. Async drivers bind connections to the loop that
opened them: a store given to sync functions is used on this loop only.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["portal"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def portal() -> asyncio.AbstractEventLoop:
    """The background loop, started on first use (one per process, a daemon thread)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=run, name="headway-portal", daemon=True).start()
            ready.wait()
            _loop = loop
        return _loop


def submit(coro: Coroutine[Any, Any, T]) -> Future[T]:
    """Run ``coro`` on the portal's loop; its concurrent future."""
    return asyncio.run_coroutine_threadsafe(coro, portal())
