"""The distributed lock shared by idempotency and rate limiting."""
