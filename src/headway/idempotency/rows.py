"""How ``RecordStore`` reads a ``Record`` (and an operator's ``RecordState``) from a row of
the records table."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from headway.idempotency.record import Record, RecordState, RecordStatus, StoredResponse
from headway.idempotency.table import db_now, records

__all__ = ["GET", "INSPECT", "RECORD_COLUMNS", "read", "read_state"]

#: The columns a Record is read from, in ``read``'s order (caller and key are the ones
#: asked for).
RECORD_COLUMNS = (
    records.c.fingerprint,
    records.c.status,
    records.c.fence,
    records.c.response_status,
    records.c.response_headers,
    records.c.response_body,
)

#: ``get``'s statement, built once: SQLAlchemy memoizes a statement object's cache key,
#: whereas building the same SELECT per call cost more client CPU than the query itself.
GET = sa.select(*RECORD_COLUMNS).where(
    records.c.scope == sa.bindparam("scope"),
    records.c.key == sa.bindparam("key"),
    records.c.expires_at > db_now(),
)

_STATUSES = {status.value: status for status in RecordStatus}


def read(values: Sequence[Any], caller: str, key: str) -> Record:
    """The Record in ``RECORD_COLUMNS`` values (by position: Row attributes cost more)."""
    fingerprint, status, fence, response_status, headers, body = values
    response = None
    if response_status is not None:
        pairs = tuple([(str(k), str(v)) for k, v in headers or ()])
        response = StoredResponse(response_status, pairs, body)
    return Record(caller, key, fingerprint, _STATUSES[status], int(fence), response)


#: ``inspect``'s statement: the body's length is computed by the database, so the body
#: itself never leaves it.
INSPECT = sa.select(
    records.c.status,
    records.c.fingerprint,
    records.c.fence,
    records.c.created_at,
    records.c.expires_at,
    records.c.lease_expires_at,
    records.c.response_status,
    sa.func.length(records.c.response_body),
).where(
    records.c.scope == sa.bindparam("scope"),
    records.c.key == sa.bindparam("key"),
    records.c.expires_at > db_now(),
)


def _utc(moment: datetime) -> datetime:
    """SQLite and MySQL hand back naive datetimes, written in UTC (``db_now``)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def read_state(values: Sequence[Any], caller: str, key: str) -> RecordState:
    """The RecordState in ``INSPECT``'s values."""
    status, fingerprint, fence, created, expires, lease, response_status, size = values
    in_flight = status == RecordStatus.PROCESSING and lease is not None
    return RecordState(
        caller, key, _STATUSES[status], fingerprint, int(fence),
        created_at=_utc(created), expires_at=_utc(expires),
        lease_expires_at=_utc(lease) if in_flight else None,
        response_status=response_status, response_size=None if size is None else int(size),
    )  # fmt: skip
