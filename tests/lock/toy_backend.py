"""A toy lock backend: a dict and asyncio events behind ``LockBackend``, implemented directly.

Written from the docstrings of ``headway.lock.contract`` and ``headway.Lease`` (and
"Add a lock backend" in ``docs/extending.md``) alone: no ``MemoryLockBackend``, no
driver, no ``QueuedBackend``. It joins the shared suite (``LOCK_BACKENDS`` in
``conftest.py``), which shows that a backend written against the contract alone can
pass it.

Each call simulates a network round trip: one loop turn for the request, the "server"
acts without awaiting, one loop turn for the reply. So a cancellation can land before
the server acted (nothing to undo) or after it (a grant to undo; a release already done).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass, field

from headway import Lease, LockNotAcquired, LockNotOwned
from headway.lock.lease import check_timeout, check_ttl, new_token

__all__ = ["ToyLockBackend"]


async def _trip() -> None:
    """One leg of a simulated round trip."""
    await asyncio.sleep(0)


@dataclass
class _Resource:
    """One resource on the "server": its holder, when that lease runs out, the queue."""

    holder: str | None = None
    expires: float = 0.0
    fences: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    queue: deque[asyncio.Event] = field(default_factory=deque)

    def free(self, now: float) -> bool:
        return self.holder is None or now >= self.expires

    def holds(self, token: str, now: float) -> bool:
        return self.holder == token and now < self.expires

    def wake_head(self) -> None:
        """Tell the first waiter to look again (it re-checks: a spurious wake is harmless)."""
        if self.queue:
            self.queue[0].set()

    def drop(self, token: str, now: float) -> bool:
        """Release ``token``'s lease if it still holds it; wake the next waiter."""
        if not self.holds(token, now):
            return False
        self.holder = None
        self.wake_head()
        return True


class ToyLockBackend:
    """One process's locks, FIFO: a waiter goes before any later acquire."""

    name = "toy"

    def __init__(self) -> None:
        # Never pruned, so fences keep increasing after a resource falls idle.
        self._resources: dict[str, _Resource] = {}

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        ttl_ms = check_ttl(ttl)  # Lock passes a per-call ttl/timeout through unchecked
        give_up = time.monotonic() + check_timeout(timeout)
        state = self._resources.setdefault(resource, _Resource())
        ticket = asyncio.Event()
        await _trip()  # cancelled here: the server never saw the request
        state.queue.append(ticket)
        try:
            lease = await self._wait_turn(resource, state, ticket, ttl_ms, give_up)
        finally:  # timed out or cancelled while queued: leave the queue
            if ticket in state.queue:
                state.queue.remove(ticket)
                state.wake_head()  # we may have stood in front of the next one
        if lease is None:
            raise LockNotAcquired(f"{resource!r} is held", resource=resource)
        try:
            await _trip()  # the reply
        except asyncio.CancelledError:  # granted, but nobody will hold it: undo
            state.drop(lease.token, time.monotonic())
            raise
        return lease

    @staticmethod
    async def _wait_turn(
        resource: str, state: _Resource, ticket: asyncio.Event, ttl_ms: int, give_up: float
    ) -> Lease | None:
        """Wait until ``ticket`` heads the queue of a free lock and grant it, or None by
        ``give_up``."""
        while True:
            now = time.monotonic()
            if state.queue[0] is ticket and state.free(now):
                state.queue.popleft()
                token = new_token()
                state.holder, state.expires = token, now + ttl_ms / 1000
                # The server's own expiry: the lease never overstates it.
                return Lease(resource, token, next(state.fences), state.expires, ttl_ms / 1000)
            if now >= give_up:
                return None
            wait = give_up - now
            if state.holder is not None:  # wake when its lease runs out, unreleased
                wait = min(wait, max(state.expires - now, 0.0))
            ticket.clear()
            try:
                async with asyncio.timeout(wait):
                    await ticket.wait()
            except TimeoutError:
                pass

    async def release(self, lease: Lease) -> None:
        state = self._resources.get(lease.resource)
        released = False
        try:
            await _trip()
        finally:  # even if cancelled on the way: a cancelled release still releases
            released = state is not None and state.drop(lease.token, time.monotonic())
        if not released:
            raise LockNotOwned(
                f"{lease.resource!r} is not held by this lease", resource=lease.resource
            )

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        ttl_ms = check_ttl(ttl)
        sent = time.monotonic()
        await _trip()
        state = self._resources.get(lease.resource)
        now = time.monotonic()
        if state is None or not state.holds(lease.token, now):
            raise LockNotOwned(
                f"{lease.resource!r} is not held by this lease", resource=lease.resource
            )
        state.expires = now + ttl_ms / 1000
        await _trip()
        return lease.renewed(ttl_ms, sent)  # counted from before the request: never overstated
