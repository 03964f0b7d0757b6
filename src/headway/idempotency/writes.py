"""The statements that settle a claimed record (renew, complete, release) and purge.

Every write that decides something is a compare-and-set on the fencing token
(``ours``), so a worker whose record was taken over cannot renew, finish or
release the newer worker's record; the store reports whether a write was accepted.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import UpdateBase

from headway.idempotency.record import RecordStatus, StoredResponse
from headway.idempotency.table import db_now, records, row_of

__all__ = ["Write", "complete", "forget", "purge_batch", "release", "renew"]


#: A write and its parameters, for ``conn.execute``.
Write = tuple[UpdateBase, dict[str, Any]]


def _ours() -> sa.ColumnElement[bool]:
    """The record, still PROCESSING under our fencing token: every fenced write's condition
    (parameters ``p_scope``, ``p_key``, ``p_fence``)."""
    return sa.and_(
        records.c.scope == sa.bindparam("p_scope", type_=sa.String()),
        records.c.key == sa.bindparam("p_key", type_=sa.String()),
        records.c.fence == sa.bindparam("p_fence", type_=sa.BigInteger()),
        records.c.status == RecordStatus.PROCESSING.value,
    )


# The fenced writes are built once, with named parameters: building one per call cost
# more client CPU than its round trip, and SQLAlchemy compiles a reused statement once.
_RENEW = (
    records.update()
    .where(_ours())
    .values(lease_expires_at=db_now(sa.bindparam("p_lease_ttl", type_=sa.Float())))
)
_COMPLETE = (
    records.update()
    .where(_ours())
    .values(
        status=RecordStatus.COMPLETED.value,
        lease_token=None,
        lease_expires_at=None,
        response_status=sa.bindparam("p_status", type_=sa.Integer()),
        response_headers=sa.bindparam("p_headers", type_=records.c.response_headers.type),
        response_body=sa.bindparam("p_body", type_=records.c.response_body.type),
        expires_at=db_now(sa.bindparam("p_ttl", type_=sa.Float())),
    )
)
_RELEASE = records.delete().where(_ours())


def _of(caller: str, key: str, fence: int, **more: Any) -> dict[str, Any]:
    return {"p_scope": caller, "p_key": key, "p_fence": fence, **more}


def renew(caller: str, key: str, fence: int, lease_ttl: float) -> Write:
    """Push our record's lease to ``lease_ttl`` s from now on the database clock."""
    return _RENEW, _of(caller, key, fence, p_lease_ttl=float(lease_ttl))


def complete(caller: str, key: str, fence: int, response: StoredResponse, ttl: float) -> Write:
    """Store ``response`` in our record, COMPLETED and kept ``ttl`` s from now."""
    headers = [list(h) for h in response.headers]
    return _COMPLETE, _of(
        caller, key, fence,
        p_status=response.status, p_headers=headers, p_body=response.body, p_ttl=float(ttl),
    )  # fmt: skip


def release(caller: str, key: str, fence: int) -> Write:
    """Delete our record, so a retry runs again."""
    return _RELEASE, _of(caller, key, fence)


def forget(caller: str, key: str, *, force: bool) -> Write:
    """Delete the record of (caller, key); unless ``force``, not while its lease lives."""
    delete = records.delete().where(row_of(caller, key))
    if force:
        return delete, {}
    lease = records.c.lease_expires_at
    return delete.where(
        sa.or_(
            records.c.status == RecordStatus.COMPLETED.value,
            lease.is_(None),
            lease <= db_now(),
            records.c.expires_at <= db_now(),
        )
    ), {}


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
