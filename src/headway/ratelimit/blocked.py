"""The limiter's local cache of blocked keys."""

from __future__ import annotations

import dataclasses

from headway._clock import Clock
from headway.ratelimit.decision import Decision, Source

__all__ = ["BlockedCache"]


class BlockedCache:
    """Keys known to be blocked until a monotonic time, answered without a round trip.

    A rejection for ``cost`` stays valid for any cost at least as large until
    its ``retry_after`` has passed (every algorithm only admits more as time
    goes by), so the cache never rejects what the backend would admit, except
    after a ``reset`` made by another process. The deadline is counted from
    before the request was sent, so it never outlasts the backend's own.
    """

    def __init__(self, clock: Clock, size: int = 10_000) -> None:
        if size < 1:
            raise ValueError(f"the blocked-key cache needs a size >= 1, got {size}")
        self.clock = clock
        self.size = size
        self._blocked: dict[str, tuple[float, int, Decision]] = {}

    def get(self, key: str, cost: int) -> Decision | None:
        """A cached rejection for ``key`` at ``cost``, or None."""
        entry = self._blocked.get(key)
        if entry is None:
            return None
        until, blocked_cost, decision = entry
        left = until - self.clock()
        if left <= 0:
            del self._blocked[key]
            return None
        if cost < blocked_cost:
            return None
        return dataclasses.replace(decision, retry_after=left, source=Source.CACHE)

    def put(self, key: str, cost: int, decision: Decision, sent: float) -> None:
        """Remember a rejection the backend made for a request sent at ``sent``."""
        if decision.allowed or decision.source is not Source.BACKEND:
            return
        if decision.retry_after <= 0:
            return
        if key not in self._blocked and len(self._blocked) >= self.size:
            # Drop the oldest entry (dicts keep insertion order).
            del self._blocked[next(iter(self._blocked))]
        self._blocked[key] = (sent + decision.retry_after, cost, decision)

    def forget(self, key: str) -> None:
        """Drop ``key`` (after a reset)."""
        self._blocked.pop(key, None)
