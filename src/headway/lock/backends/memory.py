"""The in-memory lock backend: the embedded default, and the reference model.

It implements the scripts' semantics (FIFO queue, lapsing places, fencing) in
Python for one process, so the Redis backend can be tested against it and
apps run without a server. Tokens come from one counter shared by every
resource, so they are monotonic per resource.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from headway._clock import Clock
from headway.lock.backends.memory_modes import Families, MemoryModeBackend
from headway.lock.contract import AsyncWaiter
from headway.lock.driver import QueuedBackend
from headway.lock.flow import Attempt, Try
from headway.lock.introspection import Holder, LockState, owner_of
from headway.lock.modes import LockMode, ModeKind

__all__ = ["MemoryLockBackend"]


@dataclass
class _State:
    owner: str | None = None
    expires: float = 0.0
    fence: int = 0
    # waiter id -> time until which its place is kept; dicts keep arrival order.
    queue: dict[str, float] = field(default_factory=dict)


class _Waiter:
    def __init__(self, event: asyncio.Event) -> None:
        self.event = event

    async def wait(self, seconds: float) -> None:  # the next attempt takes the lock
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.event.wait()
        self.event.clear()


class MemoryLockBackend(QueuedBackend):
    """Locks for the tasks of one process, with the same semantics as Redis.

    Offers every mode: ``ReadWriteLock`` and ``Semaphore`` work over it too.

    Args:
        clock: The clock of leases and waits (monotonic seconds); default None:
            ``time.monotonic``. Tests inject a ``FakeClock``.
    """

    name = "memory"
    modes: frozenset[ModeKind] = frozenset({"read", "write", "permits"})

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self._states: dict[str, _State] = {}
        self._fence = 0
        self._events: dict[tuple[str, str], asyncio.Event] = {}
        self._families = Families(self.clock)

    def for_mode(self, mode: LockMode) -> MemoryModeBackend:
        """This backend's locks in ``mode`` (see ``ModalLockBackend.for_mode``)."""
        return MemoryModeBackend(self._families, mode)

    async def inspect(self, resource: str) -> LockState:
        """Who holds ``resource``'s lock, and how many wait (``InspectableLockBackend``).

        Args:
            resource: The lock's name.
        """
        state = self._states.get(resource)
        if state is None:
            return LockState(resource)
        state = self._state(resource)
        holders: tuple[Holder, ...] = ()
        if state.owner is not None:
            left = state.expires - self.clock()
            holders = (Holder(state.fence, left, owner_of(state.owner)),)
        return LockState(resource, holders, len(state.queue))

    def _state(self, resource: str) -> _State:
        state = self._states.setdefault(resource, _State())
        now = self.clock()
        if state.owner is not None and state.expires <= now:
            state.owner = None
        for waiter in [w for w, until in state.queue.items() if until <= now]:
            del state.queue[waiter]
        return state

    def _forget_if_idle(self, resource: str, state: _State) -> None:
        if state.owner is None and not state.queue:
            self._states.pop(resource, None)

    def _wake_head(self, resource: str, state: _State) -> None:
        head = next(iter(state.queue), None)
        if head is not None and (event := self._events.get((resource, head))) is not None:
            event.set()

    async def _try(self, resource: str, step: Try) -> Attempt:
        state = self._state(resource)
        now = self.clock()
        if state.owner == step.token:  # a retried attempt: the same grant, as in Redis
            return Attempt(True, fence=state.fence)
        if state.owner is None:
            head = next(iter(state.queue), None)
            if head is None or head == step.waiter:
                state.owner, state.expires = step.token, now + step.ttl_ms / 1000
                state.queue.pop(step.waiter, None)
                self._fence += 1
                state.fence = self._fence
                return Attempt(True, fence=self._fence)
            pttl_ms = 0
        else:
            pttl_ms = max(1, round((state.expires - now) * 1000))
        if step.waiter:
            state.queue[step.waiter] = now + step.place_ms / 1000
        return Attempt(False, pttl_ms=pttl_ms)

    async def _release(self, resource: str, token: str) -> bool:
        state = self._state(resource)
        if state.owner != token:
            self._forget_if_idle(resource, state)
            return False
        state.owner = None
        self._wake_head(resource, state)
        self._forget_if_idle(resource, state)
        return True

    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        state = self._state(resource)
        if state.owner != token:
            self._forget_if_idle(resource, state)
            return False
        state.expires = self.clock() + ttl_ms / 1000
        return True

    async def _leave(self, resource: str, waiter: str) -> None:
        state = self._state(resource)
        state.queue.pop(waiter, None)
        if state.owner is None:
            self._wake_head(resource, state)
        self._forget_if_idle(resource, state)

    def _join(self, resource: str, waiter: str) -> AsyncWaiter | None:
        # Registering is free here; skip it only when nobody holds or waits.
        return self._register(resource, waiter) if resource in self._states else None

    async def _listen(self, resource: str, waiter: str) -> AsyncWaiter:
        return self._register(resource, waiter)

    def _register(self, resource: str, waiter: str) -> _Waiter:
        event = self._events[resource, waiter] = asyncio.Event()
        return _Waiter(event)

    async def _unlisten(self, resource: str, waiter: str) -> None:
        del self._events[resource, waiter]
