"""What the guard reports about each decision: the ``on_decision`` hook's event, the outage log.

Every decision a rule makes is counted by outcome (``DecisionOutcome``) and, when the
middleware or decorator was given ``on_decision``, reported to that hook as a
``RateLimitEvent`` (``report``: a hook that raises is logged, never the request's
failure). ``OutageLog`` logs a rule's backend failures without flooding the log.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from headway._clock import Clock
from headway.ratelimit.http.rules import RuleAnswer

__all__ = ["DecisionHook", "DecisionOutcome", "OutageLog", "RateLimitEvent", "report"]

log = logging.getLogger("headway.ratelimit")

#: How one decision went, as ``counts`` and the hook's event name it.
DecisionOutcome = Literal["allowed", "rejected", "errored"]


@dataclass(frozen=True, slots=True)
class RateLimitEvent:
    """One decision, as the ``on_decision`` hook sees it.

    Attributes:
        rule: The deciding rule's name.
        identity: Whose quota was charged (what the rule's identity returned).
        route: The request's route template, or None when unknown.
        method: The HTTP method (``GET`` for a WebSocket handshake).
        cost: The units the request cost.
        decision: The limiter's ``Decision``, or the ``Admission`` of a
            ``Concurrency`` limit.
        outcome: ``"allowed"``, ``"rejected"``, or ``"errored"`` when the backend
            failed or was too slow (then ``decision.source`` tells whether the rule
            failed open or closed).
        shadow: True when a rejection was only reported, not enforced.
    """

    rule: str
    identity: str
    route: str | None
    method: str
    cost: int
    decision: RuleAnswer
    outcome: DecisionOutcome
    shadow: bool


DecisionHook = Callable[[RateLimitEvent], "Awaitable[None] | None"]
"""The ``on_decision`` hook: called with each ``RateLimitEvent``; sync or async."""


class OutageLog:
    """One rule's backend outages, logged without flooding the log.

    A warning when decisions start failing (then at most one every ``every``
    seconds while they go on, with how many failed), and one line when the
    backend answers again after an outage that was reported.
    """

    def __init__(self, name: str, clock: Clock, every: float = 10.0) -> None:
        self.name = name
        self.clock = clock
        self.every = every
        self.failing = False
        self.reported = False  # this outage was announced
        self.failed = 0  # failed decisions since the last warning
        self.warned_at: float | None = None

    def failure(self, mode: str) -> None:
        """A decision failed (``mode``: the rule failed "open" or "closed")."""
        self.failing = True
        self.failed += 1
        now = self.clock()
        if self.warned_at is None or now - self.warned_at >= self.every:
            log.warning(
                "rate limit %r: backend failed or exceeded its budget; failing %s "
                "(%d failed decision(s) since the last report)",
                self.name, mode, self.failed,
            )  # fmt: skip
            self.warned_at, self.failed, self.reported = now, 0, True

    def success(self) -> None:
        """The backend decided."""
        if self.failing:
            if self.reported:
                log.warning("rate limit %r: backend answering again", self.name)
            self.failing = self.reported = False


async def report(hook: DecisionHook, event: RateLimitEvent) -> None:
    """Call ``hook`` with ``event`` (awaited when async); log what it raises."""
    try:
        result = hook(event)
        if result is not None and inspect.isawaitable(result):  # a sync hook returns None
            await result
    except Exception:
        # A broken metrics hook must not break the requests it observes.
        log.exception("rate limit on_decision hook failed")
