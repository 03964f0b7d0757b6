"""The record values a store returns, and how a row becomes one."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from headway.idempotency.table import Status, db_now, records

__all__ = [
    "GET",
    "INSPECT",
    "RECORD_COLUMNS",
    "Claim",
    "ClaimOutcome",
    "ForgetOutcome",
    "Record",
    "RecordState",
    "StoredResponse",
    "read",
    "read_state",
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


@dataclass(frozen=True, slots=True)
class RecordState:
    """What an operator may see of one live record (``RecordStore.inspect``): never the
    stored body or headers, which hold the caller's data, only their size and status.

    Attributes:
        scope: Whose record: the caller's scope (HTTP) or the function's namespace.
        key: The idempotency key.
        status: PROCESSING (a request holds it) or COMPLETED (its response is stored).
        fingerprint: The sha256 hex of what the request (or call) was.
        fence: The fencing token every write to the record must carry.
        created_at: When it was first claimed (database clock, UTC).
        expires_at: When it stops being replayed and ``purge`` may delete it (UTC).
        lease_expires_at: While PROCESSING, when its holder's lease lapses and a retry
            may take it over (UTC); None once COMPLETED.
        response_status: The stored response's status code; None while PROCESSING.
        response_size: The stored body's length in bytes; None while PROCESSING, or
            when the body was over ``max_body`` and not kept.
    """

    scope: str
    key: str
    status: Status
    fingerprint: str
    fence: int
    created_at: datetime
    expires_at: datetime
    lease_expires_at: datetime | None
    response_status: int | None
    response_size: int | None


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


def read_state(values: Sequence[Any], scope: str, key: str) -> RecordState:
    """The RecordState in ``INSPECT``'s values."""
    status, fingerprint, fence, created, expires, lease, response_status, size = values
    in_flight = status == Status.PROCESSING and lease is not None
    return RecordState(
        scope, key, _STATUSES[status], fingerprint, int(fence),
        created_at=_utc(created), expires_at=_utc(expires),
        lease_expires_at=_utc(lease) if in_flight else None,
        response_status=response_status, response_size=None if size is None else int(size),
    )  # fmt: skip
