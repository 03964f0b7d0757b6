"""Idempotency keys: records in SQL, guarded by the lock, completed with fenced writes."""

from ._store import Claim, ClaimOutcome, Record, RecordStore, StoredResponse
from ._table import Status, metadata, records

__all__ = [
    "Claim",
    "ClaimOutcome",
    "Record",
    "RecordStore",
    "Status",
    "StoredResponse",
    "metadata",
    "records",
]
