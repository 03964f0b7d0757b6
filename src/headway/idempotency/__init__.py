"""Idempotency keys: records in SQL, guarded by the lock, completed with fenced writes."""

from ._middleware import IdempotencyMiddleware, idempotent
from ._request import MAX_KEY_LENGTH, REPLAY_DROPPED_HEADERS, by_credentials, parse_key
from ._store import Claim, ClaimOutcome, Record, RecordStore, StoredResponse
from ._table import Status, metadata, records

__all__ = [
    "MAX_KEY_LENGTH",
    "REPLAY_DROPPED_HEADERS",
    "Claim",
    "ClaimOutcome",
    "IdempotencyMiddleware",
    "Record",
    "RecordStore",
    "Status",
    "StoredResponse",
    "by_credentials",
    "idempotent",
    "metadata",
    "parse_key",
    "records",
]
