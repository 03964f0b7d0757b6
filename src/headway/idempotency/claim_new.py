"""Claiming a key that has no record yet, in the statement that would otherwise only
read it: what a request with a key sends first.

PostgreSQL: ``WITH inserted AS (INSERT … ON CONFLICT (scope, key) DO NOTHING RETURNING
…) SELECT … FROM inserted UNION ALL SELECT … FROM records WHERE … AND NOT EXISTS
(SELECT FROM inserted)``. A new key is inserted as PROCESSING (the claim); an existing
record is only read, so a replay writes nothing (DO NOTHING inserts no tuple: no
transaction id, no WAL flush at its commit). The outer SELECT reads the statement's
snapshot, so a record inserted by a concurrent claim that committed meanwhile is
neither inserted nor seen: that, an expired record, and a PROCESSING record whose lease
ended are left to ``claim`` (the full upsert, which takes records over). Other
databases have no data-modifying CTE: there it is the primary-key read alone.

Contract: one round trip; returns the record's columns (``RECORD_COLUMNS``), its lease
expiry and expiry, the database's clock, and whether this statement inserted it.
"""

from __future__ import annotations

import secrets
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from headway.idempotency.claim import _left, answer, first_fence, processing
from headway.idempotency.record import GET, RECORD_COLUMNS, Claim, ClaimOutcome, read
from headway.idempotency.table import Status, db_now, records

__all__ = ["claim_new", "writes_nothing_on_read"]


def writes_nothing_on_read(dialect: Dialect) -> bool:
    """Whether ``claim_new`` inserts in its one statement here (PostgreSQL)."""
    return dialect.name == "postgresql"


async def claim_new(
    conn: AsyncConnection,
    scope: str,
    key: str,
    fingerprint: str,
    *,
    lease_token: str,
    lease_ttl: float,
    ttl: float,
) -> Claim | None:
    """``RecordStore.claim_new`` on ``conn`` (its docstring says what it decides)."""
    if not writes_nothing_on_read(conn.dialect):
        row = (await conn.execute(GET, {"scope": scope, "key": key})).first()
        if row is None:
            return None
        record = read(row, scope, key)
        if record.fingerprint == fingerprint and record.status is Status.PROCESSING:
            return None  # live or stalled: ``claim`` tells (and takes a stalled one over)
        return answer(record, fingerprint, None)
    params = {
        "p_scope": scope, "p_key": key, "p_fingerprint": fingerprint,
        "p_mark": f"{lease_token[:47]}.{secrets.token_hex(8)}",
        "p_lease_ttl": float(lease_ttl), "p_ttl": float(ttl), "p_first": first_fence(),
    }  # fmt: skip
    row = (await conn.execute(_STATEMENT, params)).first()
    if row is None or row.expires_at <= row.now:
        return None  # raced by a concurrent claim, or expired: ``claim`` decides
    record = read(row[:6], scope, key)
    if row.inserted:
        return Claim(ClaimOutcome.CLAIMED, fence=record.fence)
    left = _left(row.lease_expires_at, row.now)
    if record.status is Status.PROCESSING and record.fingerprint == fingerprint and not left:
        return None  # its lease ended: ``claim`` takes it over with a newer fence
    return answer(record, fingerprint, left)


def _param(name: str, type_: Any = None) -> Any:
    return sa.bindparam(name, type_=type_ or sa.String())


def _statement() -> Any:
    """The PostgreSQL statement (see the module's docstring), built once."""
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    scope, key = _param("p_scope"), _param("p_key")
    values = processing(
        _param("p_fingerprint"), _param("p_mark"),
        _param("p_lease_ttl", sa.Float()), _param("p_ttl", sa.Float()),
    )  # fmt: skip
    row = {"scope": scope, "key": key, "fence": _param("p_first", sa.BigInteger()), **values}
    tail = (records.c.lease_expires_at, records.c.expires_at)
    inserted = (
        pg_insert(records)
        .values(row)
        .on_conflict_do_nothing(index_elements=["scope", "key"])
        .returning(*RECORD_COLUMNS, *tail)
        .cte("inserted")
    )
    now = db_now().label("now")
    ours = sa.select(*inserted.c, now, sa.true().label("inserted"))
    theirs = sa.select(*RECORD_COLUMNS, *tail, now, sa.false().label("inserted")).where(
        records.c.scope == scope,
        records.c.key == key,
        ~sa.exists(sa.select(inserted.c.fence)),
    )
    return sa.union_all(ours, theirs)


_STATEMENT = _statement()
