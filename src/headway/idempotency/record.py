"""The record values a store returns, and how a row becomes one."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from headway.idempotency.table import Status, db_now, records

__all__ = [
    "GET",
    "RECORD_COLUMNS",
    "Claim",
    "ClaimOutcome",
    "ForgetOutcome",
    "Record",
    "StoredResponse",
    "read",
]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A response as kept in a record; ``body`` is None when it was too large to keep."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    """One idempotency record (live, i.e. not expired)."""

    scope: str
    key: str
    fingerprint: str
    status: Status
    fence: int
    response: StoredResponse | None


class ClaimOutcome(enum.Enum):
    """What ``claim`` found."""

    CLAIMED = "claimed"  # the record is ours, PROCESSING with our fence: run the request
    COMPLETED = "completed"  # already done with this fingerprint: replay ``record``
    MISMATCH = "mismatch"  # the key belongs to a different request
    BUSY = "busy"  # a newer or live holder has it


class ForgetOutcome(enum.Enum):
    """What ``RecordStore.forget`` found. Only ``REMOVED`` is true (it was a bool)."""

    REMOVED = "removed"  # the record is gone: the key's next request runs again
    NOT_FOUND = "not_found"  # no record for this scope and key (or only an expired one)
    IN_FLIGHT = "in_flight"  # a request holds it under a live lease: kept (``force`` removes it)

    def __bool__(self) -> bool:
        return self is ForgetOutcome.REMOVED


@dataclass(frozen=True, slots=True)
class Claim:
    """The result of ``RecordStore.claim``."""

    outcome: ClaimOutcome
    record: Record | None = None
    #: On CLAIMED: the fencing token the record now carries (the caller's, or the store's pick).
    fence: int | None = None
    #: On BUSY: seconds until the holder's lease ends at the latest (database clock), if known.
    lease_left: float | None = None


#: The columns a Record is read from, in ``read``'s order (scope and key are the caller's).
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

_STATUSES = {status.value: status for status in Status}


def read(values: Sequence[Any], scope: str, key: str) -> Record:
    """The Record in ``RECORD_COLUMNS`` values (by position: Row attributes cost more)."""
    fingerprint, status, fence, response_status, headers, body = values
    response = None
    if response_status is not None:
        pairs = tuple([(str(k), str(v)) for k, v in headers or ()])
        response = StoredResponse(response_status, pairs, body)
    return Record(scope, key, fingerprint, _STATUSES[status], int(fence), response)
