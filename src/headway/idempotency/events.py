"""What an idempotent call or request tells the ``on_event`` hook: one contract for
the middleware and for idempotent functions, so metrics and logs see both alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["IdempotencyEvent", "IdempotencyEventKind", "IdempotencyHook"]

IdempotencyEventKind = Literal[
    "claimed", "replayed", "completed", "released", "conflict", "key_reused"
]
"""What happened to one key:
``claimed`` (a first execution starts), ``replayed`` (a stored result was returned),
``completed`` (the result was stored under the fence), ``released`` (the claim was
given up, e.g. the work raised, so the key can be retried; without a ``claimed`` before
it when a claim is given back before the work starts, as when the lock backend is down
and the middleware answers 503 or the function raises), ``conflict`` (the key is
in flight elsewhere), ``key_reused`` (the key came back with different input)."""


@dataclass(frozen=True, slots=True)
class IdempotencyEvent:
    """One outcome for one key, as the ``on_event`` hook sees it.

    Attributes:
        kind: What happened (``IdempotencyEventKind``).
        caller: Whose call: the HTTP caller's id (as stored, the record's caller), or an
            idempotent function's namespace as given (its record's caller is derived from
            it). Also readable as ``scope``, its older name.
        key: The idempotency key.
        source: ``"http"`` for the middleware, ``"function"`` for idempotent functions.
        fence: The claim's fencing token when there is one, else None.
    """

    kind: IdempotencyEventKind
    caller: str
    key: str
    source: Literal["http", "function"]
    fence: int | None = None

    @property
    def scope(self) -> str:
        """``caller`` under its older name, for hooks written before the rename."""
        return self.caller


IdempotencyHook = Callable[[IdempotencyEvent], "Awaitable[None] | None"]
"""The hook: called once per ``IdempotencyEvent``; may be sync or async. An exception it
raises is logged and swallowed: metrics must never change what the caller gets."""
