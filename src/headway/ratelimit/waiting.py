"""Waiting for admission: one line per key, first come first served, in this process.

``RateLimiter.wait`` and the HTTP faces' ``max_wait`` (through the guard) both wait
here. Only a line's head asks the limiter: refused, it sleeps the refusal's
``retry_after`` (``retry_pause``, as a lone waiter always did) and asks again; the
members behind it wait for their turn, so a later arrival never overtakes an
earlier waiter of this process, and a line costs one decision per try, not one per
member. A line exists only while someone is in it; an uncontended call is its own
line's head and decides at once.

A member leaves with the latest refusal as soon as the head's next try falls past
its deadline (behind the head, it cannot be admitted in time), when its deadline passes, or, when it
was given a ``gone`` function, with ``ClientGone`` once its client leaves.
``max_waiting`` bounds the members that may wait; past it a newcomer only decides in
its turn: it is refused at once if anyone ahead of it is refused.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from headway._clock import Clock
from headway.ratelimit.arguments import check_seconds
from headway.ratelimit.decision import Decision
from headway.ratelimit.shell import retry_pause

__all__ = ["DEFAULT_MAX_WAITING", "ClientGone", "Decide", "Gone", "WaitLines", "check_waiting"]

#: How many requests may wait for admission at once, per guard (middleware, decorated
#: endpoint, dependency): docs/decisions/ratelimit.md, "Waiting instead of refusing".
DEFAULT_MAX_WAITING = 100

#: One decision of the limiter for the waiting call (charging, as ``hit``).
Decide = Callable[[], Awaitable[Decision]]
#: Starts watching the caller's client (once) and returns a future done when it leaves.
Gone = Callable[[], "asyncio.Future[None]"]


class ClientGone(Exception):
    """A waiting caller's client left: it was answered nothing and charged nothing."""


def check_waiting(max_wait: float, max_waiting: int) -> tuple[float, int]:
    """``max_wait`` (finite seconds >= 0) and ``max_waiting`` (an int >= 1), checked."""
    seconds = check_seconds("max_wait", max_wait)
    if isinstance(max_waiting, bool) or not isinstance(max_waiting, int):
        raise TypeError(f"max_waiting must be an int, not {type(max_waiting).__name__}")
    if max_waiting < 1:
        raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
    return seconds, max_waiting


class _Member:
    """One caller in a line. ``deadline``: the latest admission it accepts (its join
    time when it may not wait); ``expires``: when it stops waiting for its turn."""

    __slots__ = ("counted", "deadline", "expires", "inline", "turn")

    def __init__(self, deadline: float, expires: float, counted: bool) -> None:
        self.deadline = deadline
        self.expires = expires
        self.counted = counted
        self.inline = True
        #: Done with None when it becomes the head, or with its refusal.
        self.turn: asyncio.Future[Decision | None] | None = None


class _Line:
    """A key's members, the head first, and what the head last heard."""

    __slots__ = ("last", "members", "next_try")

    def __init__(self) -> None:
        self.members: collections.deque[_Member] = collections.deque()
        self.last: Decision | None = None  # the latest refusal on this key
        self.next_try = 0.0  # when the head asks again (clock time), once refused


class WaitLines:
    """The lines of callers waiting for admission, one per key, FIFO.

    Args:
        clock: The monotonic clock of deadlines.
        max_waiting: How many callers may wait at once, over every key; default None:
            no bound.
    """

    def __init__(self, clock: Clock, max_waiting: int | None = None) -> None:
        self.clock = clock
        self.max_waiting = max_waiting
        self.lines: dict[Hashable, _Line] = {}
        #: Members that may wait (counted against ``max_waiting``).
        self.waiting = 0

    async def admit(
        self, key: Hashable, decide: Decide, deadline: float, gone: Gone | None = None
    ) -> Decision:
        """Decide in ``key``'s line until admitted, or refused in time to leave.

        Args:
            key: Whose line (anything hashable).
            decide: One decision for this caller (it charges when it admits).
            deadline: The latest clock time at which an admission is still wanted.
            gone: Watches the caller's client; default None: it never leaves.

        Raises:
            ClientGone: ``gone``'s future completed while the caller waited.
        """
        now = self.clock()
        counted = deadline > now and (self.max_waiting is None or self.waiting < self.max_waiting)
        me = _Member(deadline if counted else now, deadline, counted)
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = _Line()
        elif line.last is not None and line.next_try > me.deadline:
            return line.last  # the head asks again too late for this caller
        line.members.append(me)
        self.waiting += counted
        try:
            if len(line.members) > 1:
                me.turn = asyncio.get_running_loop().create_future()
                refused = await self._turn(line, me, decide, gone)
                if refused is not None:
                    return refused
            return await self._lead(line, me, decide, gone)
        finally:
            self._leave(key, line, me)

    async def _turn(
        self, line: _Line, me: _Member, decide: Decide, gone: Gone | None
    ) -> Decision | None:
        """Wait to become the head: None then, or the refusal to leave with."""
        assert me.turn is not None
        waits: set[asyncio.Future[Any]] = {me.turn}
        if gone is not None:
            waits.add(gone())
        timeout = max(0.0, me.expires - self.clock())
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if me.turn.done():
            return me.turn.result()
        if gone is not None and gone().done():
            raise ClientGone
        # Expired behind others: the latest refusal (without one, the line was flowing:
        # admitting everyone, so one try out of turn takes nothing from anybody).
        return line.last if line.last is not None else await decide()

    async def _lead(self, line: _Line, me: _Member, decide: Decide, gone: Gone | None) -> Decision:
        """As the head: sleep until the next try, decide, until admitted or out of time."""
        while True:
            if line.last is not None and (early := line.next_try - self.clock()) > 0:
                await _sleep(early, gone)
            if gone is not None and gone().done():
                raise ClientGone
            decision = await decide()
            if decision.allowed or decision.failed:  # no wait ends a failure mode
                return decision
            now = self.clock()
            pause = retry_pause(decision, me.deadline, now)
            line.last = decision
            if pause is None:
                # This head gives up; the next asks at once, for its own cost (a refusal's
                # ``retry_after`` is the time for this cost, which may be more than another's).
                line.next_try = now
                return decision
            line.next_try = now + pause
            self._refuse_late(line, decision)

    def _refuse_late(self, line: _Line, refusal: Decision) -> None:
        """Send away every member behind the head whose deadline is before its next try."""
        for member in list(itertools.islice(line.members, 1, None)):
            if member.deadline < line.next_try:
                self._out(line, member)
                if member.turn is not None and not member.turn.done():
                    member.turn.set_result(refusal)

    def _out(self, line: _Line, member: _Member) -> None:
        line.members.remove(member)
        member.inline = False
        self.waiting -= member.counted

    def _leave(self, key: Hashable, line: _Line, me: _Member) -> None:
        """``me`` is done (admitted, refused, gone or cancelled): the next one's turn."""
        if me.inline:
            was_head = line.members[0] is me
            self._out(line, me)
            if was_head and line.members:
                head = line.members[0]
                if head.turn is not None and not head.turn.done():
                    head.turn.set_result(None)
        if not line.members and self.lines.get(key) is line:
            del self.lines[key]


async def _sleep(seconds: float, gone: Gone | None) -> None:
    if gone is None:
        await asyncio.sleep(seconds)
        return
    left = gone()
    await asyncio.wait({left}, timeout=seconds)
    if left.done():
        raise ClientGone
