"""The statements that settle a claimed record (renew, complete, release) and purge.

Every write that decides something is a compare-and-set on the fencing token
(``ours``), so a worker whose record was taken over cannot renew, finish or
release the newer worker's record; the store reports whether a write was accepted.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from headway.idempotency.record import StoredResponse
from headway.idempotency.table import Status, db_now, records, row_of

__all__ = ["complete", "forget", "purge_batch", "release", "renew"]


def _ours(scope: str, key: str, fence: int) -> sa.ColumnElement[bool]:
    """The record, still PROCESSING under our fencing token: every fenced write's condition."""
    return sa.and_(
        row_of(scope, key),
        records.c.fence == fence,
        records.c.status == Status.PROCESSING.value,
    )


def renew(scope: str, key: str, fence: int, lease_ttl: float) -> sa.Update:
    """Push our record's lease to ``lease_ttl`` s from now on the database clock."""
    return (
        records.update().where(_ours(scope, key, fence)).values(lease_expires_at=db_now(lease_ttl))
    )


def complete(scope: str, key: str, fence: int, response: StoredResponse, ttl: float) -> sa.Update:
    """Store ``response`` in our record, COMPLETED and kept ``ttl`` s from now."""
    return (
        records.update()
        .where(_ours(scope, key, fence))
        .values(
            status=Status.COMPLETED.value,
            lease_token=None,
            lease_expires_at=None,
            response_status=response.status,
            response_headers=[list(h) for h in response.headers],
            response_body=response.body,
            expires_at=db_now(ttl),
        )
    )


def release(scope: str, key: str, fence: int) -> sa.Delete:
    """Delete our record, so a retry runs again."""
    return records.delete().where(_ours(scope, key, fence))


def forget(scope: str, key: str, *, force: bool) -> sa.Delete:
    """Delete the record of (scope, key); unless ``force``, not while its lease lives."""
    delete = records.delete().where(row_of(scope, key))
    if force:
        return delete
    lease = records.c.lease_expires_at
    return delete.where(
        sa.or_(
            records.c.status == Status.COMPLETED.value,
            lease.is_(None),
            lease <= db_now(),
            records.c.expires_at <= db_now(),
        )
    )


async def purge_batch(conn: AsyncConnection, batch_size: int) -> tuple[int, int]:
    """Delete up to ``batch_size`` expired records: (how many were picked, deleted)."""
    expired = records.c.expires_at <= db_now()
    pick = sa.select(records.c.scope, records.c.key).where(expired).limit(batch_size)
    keys = [tuple(row) for row in (await conn.execute(pick)).all()]
    if not keys:
        return 0, 0
    # Re-checked in the DELETE: a record taken over meanwhile is not expired any more.
    delete = records.delete().where(sa.tuple_(records.c.scope, records.c.key).in_(keys), expired)
    return len(keys), (await conn.execute(delete)).rowcount
