"""A claimed record's database lease, seen as a lock backend so ``Lock.hold()`` renews it.

Holding it gives the record the same guarantees as the lock: renewed every
third of its TTL, and a refused or impossible renewal cancels the handler with
``LockLost``. It runs inside the Redis lock (so a worker that is alive keeps its
record's lease alive for database-only peers) and alone when Redis is down.
"""

from __future__ import annotations

import time

from headway._errors import LockNotOwned
from headway.idempotency.store import RecordStore
from headway.lock.lease import Lease, check_ttl

__all__ = ["RecordLease"]


class RecordLease:
    """``LockBackend`` over one PROCESSING record that is already claimed."""

    name = "database"

    def __init__(self, store: RecordStore, scope: str, key: str, fence: int, claimed_at: float):
        self.store = store
        self.scope = scope
        self.key = key
        self.fence = fence
        self.claimed_at = claimed_at  # monotonic time the claim was sent

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """The claim already holds the record: a lease counted from when it was sent."""
        return Lease(resource, "", self.fence, self.claimed_at + ttl, ttl)

    async def release(self, lease: Lease) -> None:
        """Nothing to do: the record is completed or released by the middleware."""

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        """Push the record's lease to ``ttl`` s from now on the database clock."""
        check_ttl(ttl)
        sent = time.monotonic()
        if not await self.store.renew(self.scope, self.key, self.fence, ttl):
            raise LockNotOwned(
                f"idempotency record taken over (fence {self.fence})", resource=lease.resource
            )
        return Lease(lease.resource, lease.token, lease.fence, sent + ttl, ttl)
