"""Idempotency keys: records in SQL, guarded by the lock, completed with fenced writes."""
