"""``RequestLeases``: a running request's lock lease and record lease, renewed as one.

The two leases guard different peers. The lock lease keeps lock-using peers from
running the same key at once; the record's lease (on the database clock) is what
peers excluding by the database alone (``database_fallback`` while the lock backend
is down) respect before they take a record over, and what lets any peer take over
the record of a worker that died. A live worker keeps both, so one renewal step
renews both, and the lock's watchdog (``Renewal``) runs it: a refused or impossible
renewal of either cancels the request's handler, which then ends in ``LockLost``.
"""

from __future__ import annotations

import time

from headway._errors import LockNotOwned
from headway.idempotency.contract import RecordBackend
from headway.lock.lease import Lease, check_ttl
from headway.lock.lock import Lock
from headway.lock.renewal import Renewal

__all__ = ["RequestLeases"]


class RequestLeases:
    """The leases of a request running on its claimed record, and their one watchdog.

    ``record`` is the record's lease as a ``Lease`` (the request's resource, the
    claim's token and fence, a deadline counted from when the claim was sent on the
    monotonic clock). ``lock`` is the lock and its lease, or None when the database
    alone excludes (``database_fallback``). The watchdog watches whichever lease ends
    first and renews both (``renew``).
    """

    __slots__ = ("_caller", "_key", "_lock", "_record", "_store")

    def __init__(
        self,
        store: RecordBackend,
        caller: str,
        key: str,
        record: Lease,
        lock: tuple[Lock, Lease] | None,
    ) -> None:
        self._store = store
        self._caller = caller
        self._key = key
        self._record = record
        self._lock = lock

    def _ending_first(self) -> Lease:
        if self._lock is None or self._record.deadline < self._lock[1].deadline:
            return self._record
        return self._lock[1]

    def watchdog(self, ttl: float) -> Renewal:
        """The watchdog renewing both leases for ``ttl`` s every third of it."""
        return Renewal(
            self._ending_first(), self.renew, ttl=ttl, interval=ttl / 3, clock=time.monotonic
        )

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        """Renew both leases for ``ttl`` s from now (the lock's first: it began first).

        ``lease`` is the one ending first, as returned last time; the new one ending
        first is returned. ``LockNotOwned`` if either renewal is refused.
        """
        if self._lock is not None:
            lock, held = self._lock
            self._lock = lock, await lock.extend(held, ttl)
        record, sent = self._record, time.monotonic()
        if not await self._store.renew(self._caller, self._key, record.fence, ttl):
            message = f"idempotency record taken over (fence {record.fence})"
            raise LockNotOwned(message, resource=record.resource)
        self._record = record.renewed(check_ttl(ttl), sent)
        return self._ending_first()
