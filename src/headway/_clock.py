"""Clocks.

Decisions that several machines share read the Redis server's ``TIME`` (inside
the scripts) or the database's clock. Client-side deadlines use a monotonic
clock, injectable so tests can move time by hand.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

__all__ = ["Clock", "FakeClock", "MonotonicClock", "within"]

T = TypeVar("T")


class Clock(Protocol):
    """A source of monotonic seconds."""

    def __call__(self) -> float: ...


class MonotonicClock:
    """``time.monotonic``: the default for every client-side deadline."""

    def __call__(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to (for tests and the reference model).

    Args:
        start: The time it reads until first advanced, in seconds.
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward.

        Args:
            seconds: How far, in seconds (>= 0).

        Raises:
            ValueError: ``seconds`` is negative.
        """
        if seconds < 0:
            raise ValueError("time only moves forward")
        self.now += seconds


async def within(seconds: float, aw: Awaitable[T]) -> T:
    """``await aw``, or raise ``TimeoutError`` after ``seconds`` (``asyncio.timeout``).

    The one deadline helper: the error says how long was waited (a backend's outage
    message carries it), and a cancellation from outside stays a cancellation.
    """
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            return await aw
    except TimeoutError:
        if deadline.expired():
            raise TimeoutError(f"no answer within {seconds:g} s") from None
        raise  # ``aw``'s own TimeoutError
