"""The limiter's private fast path: starting a decision without a coroutine.

Not part of the backend contract (``contract.py``): a built-in backend offers it by a
method ``_fast_path`` (``FastPathBackend``), which ``RateLimiter`` calls once, when it
is built. The Redis backend writes the script call on its pipelined connection at once
and hands back the reply's future; the memory backend answers at once. Any other
backend, or one that returns None, is awaited (``decide``) within the limiter's budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.decision import Decision

__all__ = ["FastPath", "FastPathBackend", "fast_path_of"]

#: ``(key, policies, cost, peek, timeout)`` -> a decision, a reply's future, or None.
Submit = Callable[[str, PolicySet, int, bool, float], "Decision | asyncio.Future[Any] | None"]
#: ``(key, policies, costs, timeout)`` -> ``reserve.lua``'s reply's future, or None.
SubmitReserve = Callable[[str, PolicySet, tuple[int, ...], float], "asyncio.Future[Any] | None"]
#: ``(key, policies, at_us, charged, actual, timeout)`` -> ``settle.lua``'s reply's future,
#: or None.
SubmitSettle = Callable[
    [str, PolicySet, int, tuple[int, ...], tuple[int, ...], float], "asyncio.Future[Any] | None"
]


@dataclass(frozen=True, slots=True)
class FastPath:
    """How the limiter starts a decision on one backend.

    ``submit`` returns the ``Decision`` when the backend answers at once (it never
    waits, so no budget applies); or the future of its reply when the call was written
    at once, failing with one of ``failures`` after ``timeout`` seconds (``read`` turns
    the reply into the decision); or None when neither can be done now: the limiter
    then awaits ``decide`` within its budget. ``reserve`` and ``settle``, when offered,
    start a reservation's calls the same way (a reply's future, or None).
    """

    submit: Submit
    read: Callable[[Any, PolicySet], Decision]
    failures: tuple[type[BaseException], ...]
    reserve: SubmitReserve | None = None
    settle: SubmitSettle | None = None


@runtime_checkable
class FastPathBackend(Protocol):
    """A backend that may offer a fast path: asked once, when a limiter is built."""

    def _fast_path(self) -> FastPath | None:
        """The fast path, or None when this backend cannot take it (for its life)."""
        ...


def fast_path_of(backend: object) -> FastPath | None:
    """``backend``'s fast path, if it offers one."""
    return backend._fast_path() if isinstance(backend, FastPathBackend) else None
