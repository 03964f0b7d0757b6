"""Claiming a record: insert it as PROCESSING, or take over one whose lease ran out.

One transaction of at most three statements: an INSERT that does nothing when the key
exists; if it did nothing, a SELECT of the record as it stands; and, when the decision
is to take it over, an UPDATE conditioned on the record still being what was read.
"""

from __future__ import annotations

import secrets
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from headway.idempotency.record import RECORD_COLUMNS, Claim, ClaimOutcome, Record, read
from headway.idempotency.table import Status, db_now, records, row_of

__all__ = ["claim_record"]


async def claim_record(
    conn: AsyncConnection,
    scope: str,
    key: str,
    fingerprint: str,
    *,
    fence: int | None,
    lease_token: str,
    lease_ttl: float,
    ttl: float,
) -> Claim:
    """``RecordStore.claim`` inside its transaction (its docstring says what it decides)."""
    values = _processing(fingerprint, lease_token, lease_ttl, ttl)
    first = _first_fence() if fence is None else fence
    if await _insert(conn, scope, key, first, values):
        return Claim(ClaimOutcome.CLAIMED, fence=first)
    found = await _current(conn, scope, key)
    if found is None:
        return Claim(ClaimOutcome.BUSY)  # purged meanwhile: the caller may retry
    current, expired, lease_over = found
    answer = _answer(current, expired, lease_over, fingerprint, fence)
    if answer is not None:
        return answer
    mine = current.fence + 1 if fence is None else fence
    if await _take_over(conn, current, mine, values):
        return Claim(ClaimOutcome.CLAIMED, fence=mine)
    return Claim(ClaimOutcome.BUSY)


def _processing(fingerprint: str, lease_token: str, lease_ttl: float, ttl: float) -> dict[str, Any]:
    """The columns of a freshly claimed record (all but its key and fence)."""
    return {
        "fingerprint": fingerprint,
        "status": Status.PROCESSING.value,
        "lease_token": lease_token,
        "lease_expires_at": db_now(lease_ttl),
        "response_status": None,
        "response_headers": None,
        "response_body": None,
        "created_at": db_now(),
        "expires_at": db_now(ttl),
    }


async def _insert(
    conn: AsyncConnection, scope: str, key: str, fence: int, values: dict[str, Any]
) -> bool:
    """Insert the record; False (and nothing written) if the key already has one."""
    inserted = await conn.execute(
        _insert_ignore(conn).values(scope=scope, key=key, fence=fence, **values)
    )
    return bool(inserted.rowcount == 1)


async def _current(conn: AsyncConnection, scope: str, key: str) -> tuple[Record, bool, bool] | None:
    """The record as it stands, whether it expired, and whether its lease is over."""
    now = db_now()
    query = sa.select(
        *RECORD_COLUMNS,
        (records.c.expires_at <= now).label("expired"),
        sa.or_(records.c.lease_expires_at.is_(None), records.c.lease_expires_at <= now).label(
            "lease_over"
        ),
    ).where(row_of(scope, key))
    row = (await conn.execute(query)).first()
    if row is None:
        return None
    return read(row[:6], scope, key), bool(row.expired), bool(row.lease_over)


def _answer(
    current: Record, expired: bool, lease_over: bool, fingerprint: str, fence: int | None
) -> Claim | None:
    """What to answer instead of taking ``current`` over, or None to take it over.

    An expired record is always replaced. A live one is answered from (a different
    request's key, or a completed one) unless it is PROCESSING under a lease that ran
    out, and, when the caller holds a lock, under an older fencing token than the caller's.
    """
    if expired:
        return None
    if current.fingerprint != fingerprint:
        return Claim(ClaimOutcome.MISMATCH, current)
    if current.status is Status.COMPLETED:
        return Claim(ClaimOutcome.COMPLETED, current)
    if not lease_over or (fence is not None and fence <= current.fence):
        return Claim(ClaimOutcome.BUSY, current)
    return None


async def _take_over(
    conn: AsyncConnection, current: Record, fence: int, values: dict[str, Any]
) -> bool:
    """Replace ``current`` with a fresh claim under ``fence``, if it is still what was read."""
    taken = await conn.execute(
        records.update()
        .where(
            row_of(current.scope, current.key),
            records.c.fence == current.fence,
            records.c.status == current.status.value,
        )
        .values(fence=fence, **values)
    )
    return bool(taken.rowcount == 1)


def _first_fence() -> int:
    """A fencing token for a record claimed without a lock lease.

    Random (so a stale worker's token never matches a later claim's) and below
    2**40, far under the lock's tokens (floored by the clock in microseconds, about
    1.7e15), so a lock holder can always take such a record over once its lease ends.
    """
    return secrets.randbelow(1 << 40) + 1


def _insert_ignore(conn: AsyncConnection) -> Any:
    """INSERT that does nothing (rowcount 0) when the primary key exists."""
    name = conn.dialect.name
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(records).on_conflict_do_nothing(index_elements=["scope", "key"])
    if name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(records).on_conflict_do_nothing(index_elements=["scope", "key"])
    return records.insert().prefix_with("IGNORE")  # MySQL / MariaDB
