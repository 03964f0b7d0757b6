"""Read-write locks and semaphores in memory: the reference model of ``lock.modes``.

One ``_Family`` per (family, resource): live holders and a FIFO queue of waiting
requests, each with its weight. ``MemoryLockBackend.for_mode`` returns a
``MemoryModeBackend``; the views of one backend share its families. ``Families``
also answers a semaphore's answer-at-once request (``take``, as
``lua/lock/modes/try.lua``) and gives leases back and renews them (``release``,
``extend``): the in-memory rate-limit backend keeps its concurrency slots here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from headway._clock import Clock
from headway.lock.contract import AsyncWaiter
from headway.lock.driver import QueuedBackend
from headway.lock.flow import Attempt, Try
from headway.lock.introspection import Holder, HolderMode, LockState, owner_of
from headway.lock.modes import WHOLE, LockMode, fits

__all__ = ["Families", "MemoryModeBackend"]


@dataclass(slots=True)
class _Holder:
    expires: float
    weight: int
    fence: int


@dataclass(slots=True)
class _Family:
    holders: dict[str, _Holder] = field(default_factory=dict)
    # waiter id -> (time until which its place is kept, weight), in arrival order
    queue: dict[str, tuple[float, int]] = field(default_factory=dict)
    capacity: int = WHOLE


class _Waiter:
    def __init__(self, event: asyncio.Event) -> None:
        self.event = event

    async def wait(self, seconds: float) -> None:  # the next attempt takes the lease
        try:
            async with asyncio.timeout(seconds):
                await self.event.wait()
        except TimeoutError:
            pass
        self.event.clear()


class Families:
    """The families of one ``MemoryLockBackend``, shared by its mode views."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.states: dict[tuple[str, str], _Family] = {}
        self.events: dict[str, asyncio.Event] = {}
        # One counter for every family: fences keep rising after an idle family is forgotten.
        self.fence = 0

    def get(self, key: tuple[str, str], now: float | None = None) -> _Family:
        """The family at ``key``, without the holders and places that lapsed by ``now``
        (the clock's by default)."""
        family = self.states.get(key)
        if family is None:
            family = self.states[key] = _Family()
        if now is None:
            now = self.clock()
        for token in [t for t, h in family.holders.items() if h.expires <= now]:
            del family.holders[token]
        if family.queue:
            for waiter in [w for w, (until, _) in family.queue.items() if until <= now]:
                del family.queue[waiter]
        return family

    def settle(self, key: tuple[str, str], family: _Family) -> None:
        """Wake every waiter that now fits (a prefix of the queue); forget an idle family."""
        if family.queue:
            used = sum(h.weight for h in family.holders.values())
            for waiter, (_, weight) in family.queue.items():
                used += weight
                if used > family.capacity:
                    break
                if (event := self.events.get(waiter)) is not None:
                    event.set()
        elif not family.holders:
            del self.states[key]

    def take(
        self, key: tuple[str, str], token: str, ttl_ms: int, capacity: int
    ) -> tuple[bool, int, float]:
        """One of a semaphore's ``capacity`` permits for ``token`` at once, unfenced (fence
        0), unless all are held or somebody waits (``lua/lock/modes/try.lua``).

        Returns whether it was granted, the permits held then (this one included), and
        when refused the seconds until the first lease ends (0 if nobody holds).
        """
        now = self.clock()
        family = self.get(key, now)
        family.capacity = capacity
        held = len(family.holders)  # a semaphore's permits all weigh 1
        if held >= capacity or family.queue:
            soonest = min((h.expires for h in family.holders.values()), default=now)
            return False, held, soonest - now
        family.holders[token] = _Holder(now + ttl_ms / 1000, 1, 0)
        return True, held + 1, 0.0

    def release(self, key: tuple[str, str], token: str) -> bool:
        """Give ``token``'s lease back; False if it had ended. Waiters that now fit are woken."""
        family = self.get(key)
        found = family.holders.pop(token, None) is not None
        self.settle(key, family)
        return found

    def extend(self, key: tuple[str, str], token: str, ttl_ms: int) -> bool:
        """Renew ``token``'s lease for ``ttl_ms`` from now; False if it had ended."""
        family = self.get(key)
        if (holder := family.holders.get(token)) is None:
            self.settle(key, family)
            return False
        holder.expires = self.clock() + ttl_ms / 1000
        return True

    def sweep(self) -> None:
        """Forget the families that leases running out left idle (no call came since)."""
        for key in list(self.states):
            family = self.get(key)
            if not family.holders and not family.queue:
                del self.states[key]


class MemoryModeBackend(QueuedBackend):
    """A ``MemoryLockBackend`` holding resources in one ``LockMode``."""

    name = "memory"

    def __init__(self, families: Families, mode: LockMode) -> None:
        super().__init__(families.clock)
        self.mode = mode
        self._families = families

    async def inspect(self, resource: str) -> LockState:
        """The holders of ``resource`` in this mode's family, and how many wait.

        Args:
            resource: The lock's name.
        """
        family = self._families.get(self._key(resource))
        now = self.clock()
        holders = tuple(
            Holder(h.fence, h.expires - now, owner_of(token), self._kind(h.weight))
            for token, h in sorted(family.holders.items(), key=lambda item: item[1].fence)
        )
        self._families.settle(self._key(resource), family)
        return LockState(resource, holders, len(family.queue))

    def _kind(self, weight: int) -> HolderMode:
        if self.mode.family == "permits":
            return "permits"
        return "write" if weight == WHOLE else "read"

    def _key(self, resource: str) -> tuple[str, str]:
        return (self.mode.family, resource)

    async def _try(self, resource: str, step: Try) -> Attempt:
        key = self._key(resource)
        family = self._families.get(key)
        if (holder := family.holders.get(step.token)) is not None:
            return Attempt(True, fence=holder.fence)  # a retried attempt: the same grant
        if self.mode.family == "permits":
            family.capacity = self.mode.capacity
        ahead = []
        for waiter, (_, weight) in family.queue.items():
            if waiter == step.waiter:
                break
            ahead.append(weight)
        now = self.clock()
        held = [h.weight for h in family.holders.values()]
        if fits(held, ahead, self.mode.weight, family.capacity):
            fence = self._families.fence = self._families.fence + 1
            family.holders[step.token] = _Holder(now + step.ttl_ms / 1000, self.mode.weight, fence)
            family.queue.pop(step.waiter, None)
            return Attempt(True, fence=fence)
        soonest = min((h.expires for h in family.holders.values()), default=now)
        if step.waiter:
            family.queue[step.waiter] = (now + step.place_ms / 1000, self.mode.weight)
        return Attempt(False, pttl_ms=max(1, round((soonest - now) * 1000)) if held else 0)

    async def _release(self, resource: str, token: str) -> bool:
        return self._families.release(self._key(resource), token)

    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        return self._families.extend(self._key(resource), token, ttl_ms)

    async def _leave(self, resource: str, waiter: str) -> None:
        key = self._key(resource)
        family = self._families.get(key)
        family.queue.pop(waiter, None)
        self._families.settle(key, family)

    async def _listen(self, resource: str, waiter: str) -> AsyncWaiter:
        event = self._families.events[waiter] = asyncio.Event()
        return _Waiter(event)

    async def _unlisten(self, resource: str, waiter: str) -> None:
        del self._families.events[waiter]
