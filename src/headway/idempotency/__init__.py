"""Idempotency keys: records in SQL, guarded by the lock, completed with fenced writes.

Why each module is built as it is: ``docs/decisions/index.md`` lists the decisions by file.
"""
