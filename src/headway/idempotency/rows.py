"""How ``RecordStore`` reads a ``Record`` from a row of the records table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from headway.idempotency.record import Record, RecordStatus, StoredResponse
from headway.idempotency.table import db_now, records

__all__ = ["GET", "RECORD_COLUMNS", "read"]

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
