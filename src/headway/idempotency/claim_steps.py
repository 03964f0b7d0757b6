"""Claiming a record where the database has no ``INSERT … RETURNING`` (MySQL proper).

One transaction of at most three statements: an ``INSERT IGNORE``; if it did nothing,
a SELECT of the record as it stands; and, when the decision is to take it over, an
UPDATE conditioned on the record still being what was read. PostgreSQL, SQLite and
MariaDB claim in one statement instead (``claim``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from headway.idempotency.claim import answer, first_fence, processing
from headway.idempotency.record import Claim, ClaimOutcome, Record, RecordStatus
from headway.idempotency.rows import RECORD_COLUMNS, read
from headway.idempotency.table import db_now, records, row_of

__all__ = ["claim_in_steps"]


async def claim_in_steps(
    conn: AsyncConnection,
    caller: str,
    key: str,
    fingerprint: str,
    *,
    fence: int | None,
    lease_token: str,
    lease_ttl: float,
    ttl: float,
) -> Claim:
    """``RecordStore.claim`` in up to three statements of one transaction."""
    values = processing(fingerprint, lease_token, lease_ttl, ttl)
    first = first_fence() if fence is None else fence
    insert = records.insert().prefix_with("IGNORE")
    inserted = await conn.execute(insert.values(scope=caller, key=key, fence=first, **values))
    if inserted.rowcount == 1:
        return Claim(ClaimOutcome.CLAIMED, fence=first)
    found = await _current(conn, caller, key)
    if found is None:
        return Claim(ClaimOutcome.BUSY)  # purged meanwhile: the caller may retry
    current, expired, lease_over, lease_left = found
    if not expired and (
        current.fingerprint != fingerprint
        or current.status is RecordStatus.COMPLETED
        or not lease_over
        or (fence is not None and fence <= current.fence)
    ):
        return answer(current, fingerprint, lease_left)
    mine = current.fence + 1 if fence is None else fence
    if await _take_over(conn, current, mine, values):
        return Claim(ClaimOutcome.CLAIMED, fence=mine)
    return Claim(ClaimOutcome.BUSY)


async def _current(
    conn: AsyncConnection, caller: str, key: str
) -> tuple[Record, bool, bool, float | None] | None:
    """The record as it stands, whether it expired, whether its lease is over, and how
    long that lease still lasts (seconds, database clock)."""
    now = db_now()
    lease = records.c.lease_expires_at
    query = sa.select(
        *RECORD_COLUMNS,
        (records.c.expires_at <= now).label("expired"),
        sa.or_(lease.is_(None), lease <= now).label("lease_over"),
        lease,
        now.label("now"),
    ).where(row_of(caller, key))
    row = (await conn.execute(query)).first()
    if row is None:
        return None
    left = None if row[8] is None else max(0.0, (row[8] - row.now).total_seconds())
    return read(row[:6], caller, key), bool(row.expired), bool(row.lease_over), left


async def _take_over(
    conn: AsyncConnection, current: Record, fence: int, values: dict[str, Any]
) -> bool:
    """Replace ``current`` with a fresh claim under ``fence``, if it is still what was read."""
    taken = await conn.execute(
        records.update()
        .where(
            row_of(current.caller, current.key),
            records.c.fence == current.fence,
            records.c.status == current.status.value,
        )
        .values(fence=fence, **values)
    )
    return bool(taken.rowcount == 1)
