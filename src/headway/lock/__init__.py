"""The distributed lock shared by idempotency and rate limiting.

Why each module is built as it is: ``docs/decisions/index.md`` lists the decisions by file.
"""
