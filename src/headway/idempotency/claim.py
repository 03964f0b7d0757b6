"""Claiming a record: insert it as PROCESSING, or take over one that expired or whose
lease ran out, in one statement that also returns the record as it then stands.

PostgreSQL and SQLite: ``INSERT … ON CONFLICT (scope, key) DO UPDATE SET col = CASE
WHEN <take over> THEN new ELSE col END … RETURNING``. MariaDB (no ON CONFLICT):
``INSERT … ON DUPLICATE KEY UPDATE … RETURNING`` (10.5+); it assigns left to right,
so the first assignment decides (it writes our lease token or keeps the old one) and
the others follow that token. Either way the conflicting row is always returned, so
the claim says what was there without a second statement: the record is ours exactly
when it carries the lease token this claim wrote (the caller's plus a nonce). MySQL
proper has no RETURNING: it keeps the older three-step transaction (``claim_steps``).

Contract: one round trip; returns the record's columns (``RECORD_COLUMNS``), its
lease token and lease expiry, and the database's clock (for ``Retry-After``).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from headway.idempotency.record import Claim, ClaimOutcome, Record, RecordStatus
from headway.idempotency.rows import RECORD_COLUMNS, read
from headway.idempotency.table import db_now, records

__all__ = ["claim_record", "claim_statement", "claimed", "one_statement"]


def claim_statement(
    dialect: Dialect,
    caller: str,
    key: str,
    fingerprint: str,
    *,
    fence: int | None,
    lease_token: str,
    lease_ttl: float,
    ttl: float,
) -> tuple[Any, dict[str, Any], str]:
    """``RecordStore.claim`` as one statement for ``dialect`` (its docstring says what it
    decides): the statement, its parameters, and the mark that says the claim is ours."""
    # The caller's token plus a nonce: unique to this claim even if the caller reuses a
    # token, so "the row carries it" means exactly "this statement wrote it".
    mark = f"{lease_token[:47]}.{secrets.token_hex(8)}"
    params = {
        "p_scope": caller, "p_key": key, "p_fingerprint": fingerprint, "p_mark": mark,
        "p_lease_ttl": float(lease_ttl), "p_ttl": float(ttl),
        "p_first": first_fence() if fence is None else fence, "p_fence": fence,
    }  # fmt: skip
    return _statement(dialect, locked=fence is not None), params, mark


async def claim_record(
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
    """``RecordStore.claim`` on ``conn``, e.g. inside a caller's transaction."""
    if not one_statement(conn.dialect):
        from headway.idempotency.claim_steps import claim_in_steps

        return await claim_in_steps(
            conn, caller, key, fingerprint,
            fence=fence, lease_token=lease_token, lease_ttl=lease_ttl, ttl=ttl,
        )  # fmt: skip
    statement, params, mark = claim_statement(
        conn.dialect, caller, key, fingerprint,
        fence=fence, lease_token=lease_token, lease_ttl=lease_ttl, ttl=ttl,
    )  # fmt: skip
    row = (await conn.execute(statement, params)).one()
    return claimed(row, mark, caller, key, fingerprint)


def claimed(row: Sequence[Any], mark: str, caller: str, key: str, fingerprint: str) -> Claim:
    """What the claiming statement's row (``_RETURNING``, by position) says."""
    record = read(row[:6], caller, key)
    lease_token, lease_expires_at, now = row[6:9]
    if lease_token == mark:
        return Claim(ClaimOutcome.CLAIMED, fence=record.fence)
    return answer(record, fingerprint, _left(lease_expires_at, now))


def one_statement(dialect: Dialect) -> bool:
    """Whether the claim is one statement here (all but MySQL proper, which lacks RETURNING)."""
    return dialect.name in ("postgresql", "sqlite") or bool(getattr(dialect, "is_mariadb", False))


def answer(record: Record, fingerprint: str, lease_left: float | None) -> Claim:
    """The claim's answer for a record that was not ours to take."""
    if record.fingerprint != fingerprint:
        return Claim(ClaimOutcome.MISMATCH, record)
    if record.status is RecordStatus.COMPLETED:
        return Claim(ClaimOutcome.COMPLETED, record)
    return Claim(ClaimOutcome.BUSY, record, lease_left=lease_left)


def processing(fingerprint: Any, lease_token: Any, lease_ttl: Any, ttl: Any) -> dict[str, Any]:
    """The columns of a freshly claimed record (all but its key and fence): values, or
    the named parameters of a statement built once."""
    return {
        "fingerprint": fingerprint,
        "status": RecordStatus.PROCESSING.value,
        "lease_token": lease_token,
        "lease_expires_at": db_now(lease_ttl),
        "response_status": None,
        "response_headers": None,
        "response_body": None,
        "created_at": db_now(),
        "expires_at": db_now(ttl),
    }


def _take_over(fingerprint: Any, fence: Any) -> sa.ColumnElement[bool]:
    """When an existing row is replaced: it expired, or it is the same request, still
    PROCESSING, its lease over, and (for a lock holder) under an older fencing token."""
    now = db_now()
    stalled = sa.and_(
        records.c.fingerprint == fingerprint,
        records.c.status == RecordStatus.PROCESSING.value,
        sa.or_(records.c.lease_expires_at.is_(None), records.c.lease_expires_at <= now),
    )
    if fence is not None:
        stalled = sa.and_(stalled, records.c.fence < fence)
    return sa.or_(records.c.expires_at <= now, stalled)


def _param(name: str, type_: Any = None) -> Any:
    return sa.bindparam(name, type_=type_ or sa.String())


#: The claiming statements, built once per dialect and mode (with or without a lock's
#: fence) with named parameters: building one per call cost more client CPU (~1 ms)
#: than its round trip, and a statement object reused is compiled once by SQLAlchemy.
_STATEMENTS: dict[tuple[str, bool, bool], Any] = {}


def _statement(dialect: Dialect, *, locked: bool) -> Any:
    """The claiming statement for ``dialect``: parameters ``p_scope``, ``p_key``,
    ``p_fingerprint``, ``p_mark`` (this claim's lease token), ``p_lease_ttl``, ``p_ttl``,
    ``p_first`` (the fence of a new row) and, when ``locked``, ``p_fence``."""
    cache_key = (dialect.name, bool(getattr(dialect, "is_mariadb", False)), locked)
    statement = _STATEMENTS.get(cache_key)
    if statement is None:
        fence = _param("p_fence", sa.BigInteger()) if locked else None
        values = processing(
            _param("p_fingerprint"), _param("p_mark"),
            _param("p_lease_ttl", sa.Float()), _param("p_ttl", sa.Float()),
        )  # fmt: skip
        first = _param("p_first", sa.BigInteger())
        statement = _upsert(dialect, _param("p_scope"), _param("p_key"), first, fence, values)
        _STATEMENTS[cache_key] = statement
    return statement


def _upsert(
    dialect: Dialect, caller: Any, key: Any, first: Any, fence: Any, values: dict[str, Any]
) -> Any:
    """The one claiming statement for ``dialect`` (see the module's docstring)."""
    new = {**values, "fence": records.c.fence + 1 if fence is None else fence}
    row = {"scope": caller, "key": key, "fence": first, **values}
    when = _take_over(values["fingerprint"], fence)
    if dialect.name in ("postgresql", "sqlite"):
        sets = {name: sa.case((when, value), else_=records.c[name]) for name, value in new.items()}
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            pg = pg_insert(records).values(row)
            return pg.on_conflict_do_update(index_elements=["scope", "key"], set_=sets).returning(
                *_RETURNING
            )
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        lite = sqlite_insert(records).values(row)
        return lite.on_conflict_do_update(index_elements=["scope", "key"], set_=sets).returning(
            *_RETURNING
        )
    from sqlalchemy.dialects.mysql import insert as mysql_insert

    # Left to right: lease_token first (this claim's iff it takes over), the rest follow it.
    ours = records.c.lease_token == values["lease_token"]
    rest = [(n, sa.func.IF(ours, v, records.c[n])) for n, v in new.items() if n != "lease_token"]
    decide = sa.func.IF(when, values["lease_token"], records.c.lease_token)
    maria = mysql_insert(records).values(row)
    return maria.on_duplicate_key_update([("lease_token", decide), *rest]).returning(*_RETURNING)


#: What the claim returns: the record, its lease, and the database's clock.
_RETURNING = (
    *RECORD_COLUMNS,
    records.c.lease_token,
    records.c.lease_expires_at,
    db_now().label("now"),
)


def _left(lease_expires_at: Any, now: Any) -> float | None:
    """Seconds until the lease ends on the database clock (None: no lease)."""
    if lease_expires_at is None or now is None:
        return None
    return max(0.0, float((lease_expires_at - now).total_seconds()))


def first_fence() -> int:
    """A fencing token for a record claimed without a lock lease.

    Random (so a stale worker's token never matches a later claim's) and below
    2**40, far under the lock's tokens (floored by the clock in microseconds, about
    1.7e15), so a lock holder can always take such a record over once its lease ends.
    """
    return secrets.randbelow(1 << 40) + 1
