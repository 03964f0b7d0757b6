"""The acquire loop as a sans-I/O generator, shared by the async and sync shells.

The generator yields what to do next (``Try``, ``Wait``, ``Leave``) and is sent
the outcome; it decides nothing by itself about I/O, so one copy of the logic
serves both clients and every queued backend (``headway.lock.driver`` drives it).

Waiting is not polling: a waiter holds a place in the resource's FIFO queue and
is woken by the releasing holder, which (on Redis) hands it the lock along with
the wake-up, so the waiter needs no attempt of its own. Each wait is still bounded (by the holder's
remaining lease and by ``WAIT_CAP``) so a lost message, a dead holder or a dead
waiter ahead only ever costs a bounded delay.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from headway._errors import LockNotAcquired
from headway.lock.lease import Lease, check_timeout, check_ttl, new_token

__all__ = [
    "PLACE_MS",
    "WAIT_CAP",
    "Attempt",
    "Leave",
    "Listen",
    "Step",
    "Try",
    "Wait",
    "Wake",
    "acquire_flow",
    "parse_waiter",
    "parse_wake",
    "waiter_id",
]

#: Longest single wait before a waiter tries again (and so renews its place).
WAIT_CAP = 0.5
#: How long a waiter's place in the queue survives without renewal: a few waits,
#: so only a dead waiter ever loses it.
PLACE_MS = 2000
#: Wait when the lock is free but an earlier waiter goes first (it was woken and
#: is on its way); the wake-up addressed to us usually ends this wait early.
_FREE_RETRY = 0.05


def waiter_id(token: str, ttl_ms: int, node: str = "") -> str:
    """A waiter's id in the queue, for a direct handoff: the token it will hold, its TTL,
    and the client it waits in (``node``; a release from that client tells it directly).
    """
    return f"{token}:{ttl_ms}:{node}"


def parse_waiter(waiter: str) -> tuple[str, int, str]:
    """The token, TTL (ms) and node of a waiter id (``waiter_id``'s inverse)."""
    token, ttl_ms, node = waiter.rsplit(":", 2)
    return token, int(ttl_ms), node


class _Settable(Protocol):
    def set(self) -> None: ...


E = TypeVar("E", bound=_Settable)


class Wake(Generic[E]):
    """One waiter's wake-up: its event (asyncio's or threading's) and, once the
    releaser handed it the lock, the fencing token.
    """

    __slots__ = ("event", "fence")

    def __init__(self, event: E) -> None:
        self.event = event
        self.fence: int | None = None

    def set(self, fence: int | None = None) -> None:
        """Wake the waiter (with the fence, if it was handed the lock)."""
        if fence is not None:
            self.fence = fence
        self.event.set()


def parse_wake(message: str) -> tuple[str, int | None]:
    """A wake-up message: ``"<waiter>"`` (try again) or ``"<waiter> <fence>"`` (handed the lock)."""
    waiter, _, fence = message.partition(" ")
    return waiter, int(fence) if fence else None


@dataclass(frozen=True, slots=True)
class Attempt:
    """Outcome of one acquire attempt: the fence if granted, else the holder's PTTL."""

    granted: bool
    fence: int = 0
    pttl_ms: int = 0

    @classmethod
    def from_reply(cls, reply: list[int]) -> Attempt:
        """Parse the ``lock/acquire`` script's ``{granted, value}`` reply."""
        granted, value = int(reply[0]), int(reply[1])
        return cls(True, fence=value) if granted else cls(False, pttl_ms=value)


@dataclass(frozen=True, slots=True)
class Try:
    """Run one acquire attempt; send back an ``Attempt``."""

    token: str
    ttl_ms: int
    waiter: str
    place_ms: int


@dataclass(frozen=True, slots=True)
class Listen:
    """Start listening for wake-ups addressed to ``waiter``.

    Send back True if wake-ups already reached the waiter before the last
    attempt was sent (none can have been missed), else False.
    """

    waiter: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait for a wake-up addressed to the waiter, at most ``seconds``.

    Send back the fencing token if the wake-up handed the lock over, else None.
    """

    seconds: float


@dataclass(frozen=True, slots=True)
class Leave:
    """Give up the waiter's place in the queue; send back None. The flow then fails."""

    waiter: str


Step = Try | Listen | Wait | Leave


def acquire_flow(
    resource: str,
    ttl: float,
    timeout: float,
    clock: Callable[[], float],
    node: str = "",
) -> Generator[Step, Attempt | bool | int | None, Lease]:
    """Acquire ``resource`` for ``ttl`` seconds, waiting up to ``timeout`` seconds.

    ``node`` names the backend in the waiter's id (see ``waiter_id``).
    """
    ttl_ms = check_ttl(ttl)
    timeout = check_timeout(timeout)
    token = new_token()
    waiter = waiter_id(token, ttl_ms, node) if timeout > 0 else ""
    deadline = clock() + timeout
    listening = False
    while True:
        sent = clock()
        attempt = yield Try(token, ttl_ms, waiter, PLACE_MS)
        assert isinstance(attempt, Attempt)
        if attempt.granted:
            return Lease(resource, token, attempt.fence, sent + ttl_ms / 1000, ttl_ms / 1000)
        remaining = deadline - clock()
        if remaining <= 0:
            if waiter:
                yield Leave(waiter)
            raise LockNotAcquired(
                f"lock {resource!r} not acquired within {timeout:g} s", resource=resource
            )
        if not listening:
            # Subscribe only once waiting is certain (an uncontended acquire stays one
            # round trip), then try again at once: a release that happened before the
            # subscription took effect cannot leave us waiting for a lost wake-up.
            # No retry is needed if we were listening before the attempt was sent.
            listening = True
            if not (yield Listen(waiter)):
                continue
        hint = attempt.pttl_ms / 1000 if attempt.pttl_ms > 0 else _FREE_RETRY
        # A little jitter keeps waiters whose wake-up was lost from retrying in step.
        handed = yield Wait(min(remaining, hint * random.uniform(1.0, 1.1), WAIT_CAP))
        if handed is not None:
            # The releaser handed us the lock. That happened after our last attempt
            # (refused) was sent, so counting the lease from then never overstates it.
            assert isinstance(handed, int)
            return Lease(resource, token, handed, sent + ttl_ms / 1000, ttl_ms / 1000)
