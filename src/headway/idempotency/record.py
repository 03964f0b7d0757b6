"""The values of an idempotency record, as a ``RecordBackend`` takes and returns them.

Plain values, no storage: a store of your own builds them from what it keeps (``RecordStore``
reads them from table rows in ``rows``). All are exported from ``headway``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

__all__ = [
    "Claim",
    "ClaimOutcome",
    "ForgetOutcome",
    "Record",
    "RecordState",
    "RecordStatus",
    "StoredResponse",
]


class RecordStatus(enum.StrEnum):
    """Where a record stands: ``PROCESSING`` while a worker runs its request (under a
    lease), ``COMPLETED`` once its response is stored."""

    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A response (or a function's result) as kept in a record.

    Args:
        status: The HTTP status (a function's result: 200).
        headers: The header fields kept, as (name, value) pairs in order.
        body: The body; None when it was too large to keep (a replay then answers
            without it).
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    """One live idempotency record (its ``ttl`` not run out), as ``RecordBackend.get``
    returns it.

    Args:
        caller: Whose record: the HTTP caller's id or the function's namespace id.
        key: The idempotency key.
        fingerprint: What the request (or call) that claimed it was.
        status: ``PROCESSING`` or ``COMPLETED``.
        fence: The fencing token of the claim that holds (or completed) it.
        response: What ``complete`` stored; None while PROCESSING.
    """

    caller: str
    key: str
    fingerprint: str
    status: RecordStatus
    fence: int
    response: StoredResponse | None


class ClaimOutcome(enum.Enum):
    """What ``RecordBackend.claim`` found."""

    CLAIMED = "claimed"  # the record is ours, PROCESSING with our fence: run the request
    COMPLETED = "completed"  # already done with this fingerprint: replay ``record``
    MISMATCH = "mismatch"  # the key belongs to a different request
    BUSY = "busy"  # a newer or live holder has it


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer of ``RecordBackend.claim``.

    Args:
        outcome: What the claim found (``ClaimOutcome``).
        record: The record found, for COMPLETED, MISMATCH and BUSY; default None (and
            None on CLAIMED).
        fence: On CLAIMED, the fencing token the record now carries (the store's pick);
            default None.
        lease_left: On BUSY, seconds until the holder's lease ends at the latest (the
            store's clock), if known; default None.
    """

    outcome: ClaimOutcome
    record: Record | None = None
    fence: int | None = None
    lease_left: float | None = None


class ForgetOutcome(enum.Enum):
    """What ``RecordStore.forget`` found. Only ``REMOVED`` is true (it was a bool)."""

    REMOVED = "removed"  # the record is gone: the key's next request runs again
    NOT_FOUND = "not_found"  # no record for this caller and key (or only an expired one)
    IN_FLIGHT = "in_flight"  # a request holds it under a live lease: kept (``force`` removes it)

    def __bool__(self) -> bool:
        return self is ForgetOutcome.REMOVED


@dataclass(frozen=True, slots=True)
class RecordState:
    """What an operator may see of one live record (``RecordStore.inspect``): never the
    stored body or headers, which hold the caller's data, only their size and status.

    Attributes:
        caller: Whose record: the HTTP caller's id or the function's namespace id.
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

    caller: str
    key: str
    status: RecordStatus
    fingerprint: str
    fence: int
    created_at: datetime
    expires_at: datetime
    lease_expires_at: datetime | None
    response_status: int | None
    response_size: int | None
