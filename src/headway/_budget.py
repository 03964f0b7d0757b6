"""``Budget``: bounds on a backend call's time, one loop timer for all of them."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["Budget"]

T = TypeVar("T")


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
