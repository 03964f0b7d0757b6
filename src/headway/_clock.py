"""Clocks.

Decisions that several machines share read the Redis server's ``TIME`` (inside
the scripts) or the database's clock. Client-side deadlines use a monotonic
clock, injectable so tests can move time by hand.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "FakeClock", "MonotonicClock"]


class Clock(Protocol):
    """A source of monotonic seconds."""

    def __call__(self) -> float: ...


class MonotonicClock:
    """``time.monotonic``: the default for every client-side deadline."""

    def __call__(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to (for tests and the reference model)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        self.now += seconds
