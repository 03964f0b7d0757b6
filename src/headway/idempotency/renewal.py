"""``LeaseRenewal``: one watchdog per request, renewing its lock lease and its record's lease.

The two leases guard different peers. The lock lease keeps lock-using peers from
running the same key at once; the record's lease (on the database clock) is what
peers excluding by the database alone (``database_fallback`` while the lock backend
is down) respect before they take a record over, and what lets any peer take over
the record of a worker that died. A live worker keeps both, so both are renewed, in
one loop: a refused or impossible renewal of either cancels the request's handler,
which then ends in ``LockLost``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from types import TracebackType

from headway._errors import BackendUnavailable, LockLost, LockNotOwned
from headway.idempotency.store import RecordStore
from headway.lock.lease import Lease
from headway.lock.lock import Lock

__all__ = ["LeaseRenewal"]

log = logging.getLogger("headway.idempotency")


class LeaseRenewal:
    """Renew a claimed record's lease, and the request's lock lease, while a block runs.

    ``lock`` is the lock and its lease, or None when the database alone excludes
    (``database_fallback``). ``resource`` is what a ``LockLost`` names.
    ``claimed_at`` is the monotonic time the claim was sent: the record's lease is
    counted from then. Renewals come every third of ``ttl``; the first one starts a
    task, so a block that ends sooner costs a timer only. If a renewal is refused
    (``LockNotOwned``), or a lease runs out before a renewal gets through, the block
    is cancelled and ``LockLost`` raised in its place (an outside cancellation stays one).
    """

    def __init__(
        self,
        resource: str,
        store: RecordStore,
        scope: str,
        key: str,
        fence: int,
        claimed_at: float,
        ttl: float,
        lock: tuple[Lock, Lease] | None,
    ) -> None:
        self.resource = resource
        self._store = store
        self._scope = scope
        self._key = key
        self._fence = fence
        self._ttl = ttl
        self._interval = ttl / 3
        self._lock = lock
        self._record_deadline = claimed_at + ttl
        # The first renewal is due a third of a TTL after the older lease began.
        self._renew_at = self._deadline() - ttl + self._interval
        self._reason: BaseException | None = None
        self._owner: asyncio.Task[object] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._watchdog: asyncio.Task[None] | None = None

    def _deadline(self) -> float:
        """The monotonic time the first of the two leases runs out."""
        if self._lock is None:
            return self._record_deadline
        return min(self._lock[1].deadline, self._record_deadline)

    async def __aenter__(self) -> None:
        self._owner = asyncio.current_task()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, self._renew_at - time.monotonic()), self._start)

    def _start(self) -> None:
        self._timer = None
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(max(0.0, min(self._renew_at, self._deadline()) - time.monotonic()))
            now, deadline = time.monotonic(), self._deadline()
            if now >= deadline:
                message = f"lease ran out before it was renewed on {self.resource!r}"
                self._lose(LockLost(message, resource=self.resource))
                return
            try:
                async with asyncio.timeout(deadline - now):
                    await self._renew()
                self._renew_at = time.monotonic() + self._interval
            except LockNotOwned as exc:
                self._lose(exc)
                return
            except (BackendUnavailable, TimeoutError) as exc:
                log.warning("renewing %r failed, retrying: %s", self.resource, exc)
                self._renew_at = time.monotonic() + min(self._interval, 0.1)

    async def _renew(self) -> None:
        """Renew both leases for a TTL from now; ``LockNotOwned`` if either is refused."""
        if self._lock is not None:
            lock, lease = self._lock
            self._lock = lock, await lock.extend(lease, self._ttl)
        sent = time.monotonic()
        if not await self._store.renew(self._scope, self._key, self._fence, self._ttl):
            message = f"idempotency record taken over (fence {self._fence})"
            raise LockNotOwned(message, resource=self.resource)
        self._record_deadline = sent + self._ttl

    def _lose(self, reason: BaseException) -> None:
        self._reason = reason
        assert self._owner is not None
        self._owner.cancel(f"lease on {self.resource!r} lost")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._owner is not None
        if self._timer is not None:
            self._timer.cancel()
        if self._watchdog is not None:
            self._watchdog.cancel()
        reason, other_cancel = self._reason, False
        if reason is not None:
            if exc_type is not asyncio.CancelledError:
                # The block ended before our cancellation reached it: absorb it now.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0)
            other_cancel = self._owner.uncancel() > 0
        if self._watchdog is not None:
            await asyncio.wait([self._watchdog])
        if reason is not None and not other_cancel:
            if isinstance(reason, LockLost):
                raise reason
            message = f"lease on {self.resource!r} lost: {reason}"
            raise LockLost(message, resource=self.resource) from reason
