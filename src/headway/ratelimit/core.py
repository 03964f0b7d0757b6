"""The limiter's pure parts: argument checks, the local blocked-key cache, the budget."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from headway._clock import Clock
from headway.ratelimit.decision import Decision, Source
from headway.ratelimit.policies import (
    FixedWindow,
    LeakyBucket,
    Policy,
    PolicySet,
    SlidingCounter,
    SlidingLog,
    TokenBucket,
)

__all__ = ["BlockedCache", "Budget", "check_cost", "check_policies", "check_seconds"]

T = TypeVar("T")

_POLICY_TYPES = (TokenBucket, LeakyBucket, FixedWindow, SlidingLog, SlidingCounter)


def check_policies(policies: Sequence[Policy]) -> PolicySet:
    """At least one policy, each a policy value, no two alike (they would share state)."""
    if not policies:
        raise ValueError("a rate limiter needs at least one policy")
    for policy in policies:
        if not isinstance(policy, _POLICY_TYPES):
            raise TypeError(f"not a rate-limit policy: {policy!r}")
    parts = [p.key_part for p in policies]
    if len(set(parts)) != len(parts):
        raise ValueError(f"two policies with the same parameters: {list(policies)!r}")
    return PolicySet(policies)


def check_cost(cost: int, policies: Sequence[Policy]) -> int:
    """A cost is a whole number of units that every policy could admit at least once."""
    if cost == 1 and type(cost) is int:  # the usual case, checked first (hot path)
        return cost
    if isinstance(cost, bool) or not isinstance(cost, int):
        raise TypeError(f"cost must be an int, not {type(cost).__name__}")
    if cost < 1:
        raise ValueError(f"cost must be >= 1, got {cost}")
    smallest = min(policies, key=lambda p: p.limit)
    if cost > smallest.limit:
        raise ValueError(f"cost {cost} can never be admitted: {smallest!r} admits {smallest.limit}")
    return cost


def check_seconds(name: str, value: float) -> float:
    """A finite, non-negative number of seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return float(value)


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


class _Deadlines:
    """The pending budgets of one duration on one loop, behind a single loop timer.

    Deadlines are ``loop.time() + seconds`` for a fixed ``seconds``, so the
    order they are added in is the order they fall due: a dict keeps them in
    that order, an entry is one dict item, and one timer, armed at the
    earliest deadline, cancels the tasks whose time is up and re-arms for the
    next. Ending a budget is a ``dict.pop``: no timer handle is built, pushed
    on the loop's heap or cancelled per call.
    """

    __slots__ = ("expired", "loop", "pending", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[int, tuple[float, asyncio.Task[object]]] = {}
        self.expired: set[int] = set()  # entries whose task this timer cancelled
        self.timer: asyncio.TimerHandle | None = None

    def add(self, key: int, deadline: float, task: asyncio.Task[object]) -> None:
        self.pending[key] = (deadline, task)
        if self.timer is None:  # else it is armed no later than any pending deadline
            self.timer = self.loop.call_at(deadline, self._fire, deadline)

    def _fire(self, armed: float) -> None:
        self.timer = None
        # The loop runs a timer up to its clock resolution early: ``armed`` has come.
        now = max(armed, self.loop.time())
        pending = self.pending
        while pending:
            key = next(iter(pending))
            deadline, task = pending[key]
            if deadline > now:
                self.timer = self.loop.call_at(deadline, self._fire, deadline)
                return
            del pending[key]
            self.expired.add(key)
            task.cancel()


_ids = itertools.count()


class Budget:
    """Bounds awaits to ``seconds`` each, for any number of tasks (as ``_clock.within``).

    What ``asyncio.timeout`` does for one await, at a fraction of its cost on
    the hot path: starting and ending a budget are a dict insert and a pop,
    and one loop timer per loop serves every budget pending on it. A
    cancellation from outside stays a cancellation.
    """

    __slots__ = ("_state", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._state: _Deadlines | None = None

    def deadlines(self) -> _Deadlines:
        """This loop's deadlines (a budget shared by several loops keeps the latest one's)."""
        loop = asyncio.get_running_loop()
        state = self._state
        if state is None or state.loop is not loop:
            state = self._state = _Deadlines(loop)
        return state

    async def run(self, aw: Awaitable[T]) -> T:
        """``await aw``, or raise ``TimeoutError`` after ``seconds``."""
        state = self.deadlines()
        task = asyncio.current_task(state.loop)
        assert task is not None
        key = next(_ids)
        state.add(key, state.loop.time() + self.seconds, task)
        try:
            return await aw
        except asyncio.CancelledError:
            if key in state.expired and task.uncancel() == 0:
                raise TimeoutError(f"no answer within {self.seconds:g} s") from None
            raise
        finally:
            state.pending.pop(key, None)
            if state.expired:
                state.expired.discard(key)
