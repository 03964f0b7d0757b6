"""Every exception headway raises, in one tree.

    HeadwayError                  catch-all for headway's own failures
    ├── BackendUnavailable        Redis or the database is down, or slower than its budget
    │   └── DatabaseNotMigrated   the idempotency table is missing: run ``headway migrate``
    ├── ConcurrencyLimitExceeded  ``ConcurrencyLimiter.hold`` found no free slot (``.admission``)
    ├── IdempotencyError          an idempotent function's call was refused (``.key``)
    │   ├── IdempotencyInProgress the same key is running elsewhere (``on_conflict="raise"``,
    │   │                         or the wait ran out)
    │   ├── IdempotencyKeyReused  the key was used before with different arguments
    │   └── ResultNotSerializable the serializer cannot store the result (also a TypeError)
    └── LockError                 something about one lock (``.resource`` names it)
        ├── LockNotAcquired       ``acquire`` gave up: timeout elapsed, or no quorum
        ├── LockNotOwned          release/extend of a lease that is no longer held
        └── LockLost              ``hold()`` lost its lease; the protected block was cancelled

Bad arguments (a TTL <= 0, an absurd timeout) raise the built-in ``ValueError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headway.ratelimit.slots import Admission

__all__ = [
    "BackendUnavailable",
    "ConcurrencyLimitExceeded",
    "DatabaseNotMigrated",
    "HeadwayError",
    "IdempotencyError",
    "IdempotencyInProgress",
    "IdempotencyKeyReused",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "ResultNotSerializable",
]


class HeadwayError(Exception):
    """Base class of every headway error."""


class BackendUnavailable(HeadwayError):
    """The backend (Redis, a Redlock quorum, the database) could not answer in time.

    Catch it to fail open or closed deliberately.

    Args:
        message: What failed, and for how long it was waited on.
        backend: The name of the backend that failed (``redis``, ``postgres``...), kept
            as ``.backend``.
    """

    def __init__(self, message: str, *, backend: str) -> None:
        super().__init__(message)
        self.backend = backend


class DatabaseNotMigrated(BackendUnavailable):
    """The idempotency records table does not exist: run ``headway migrate URL``.

    Requests are refused as in an outage (503 with ``Retry-After``) until it does.
    """


class ConcurrencyLimitExceeded(HeadwayError):
    """Every slot of a concurrency limit is in use; the block did not run.

    Args:
        message: Which key, and how many of its slots are in use.
        admission: The refused ``Admission``, kept as ``.admission``: the numbers for a
            reply (limit, in flight, retry after).
    """

    def __init__(self, message: str, *, admission: Admission) -> None:
        super().__init__(message)
        self.admission = admission


class IdempotencyError(HeadwayError):
    """An idempotent function's call was refused.

    Args:
        message: Why.
        namespace: The function's namespace, kept as ``.namespace``.
        key: The idempotency key of the call, kept as ``.key``.
    """

    def __init__(self, message: str, *, namespace: str, key: str) -> None:
        super().__init__(message)
        self.namespace = namespace
        self.key = key


class IdempotencyInProgress(IdempotencyError):
    """A call with the same key is running elsewhere; the body did not run here. Retry later."""


class IdempotencyKeyReused(IdempotencyError):
    """The key was used before for a call with different arguments; nothing ran."""


class ResultNotSerializable(IdempotencyError, TypeError):
    """The serializer cannot store the body's result; nothing was stored, the key is free again.

    The body did run: its side effects happened, only its result was not kept.
    """


class LockError(HeadwayError):
    """A lock operation failed.

    Args:
        message: What failed.
        resource: The lock's resource name, kept as ``.resource``.
    """

    def __init__(self, message: str, *, resource: str) -> None:
        super().__init__(message)
        self.resource = resource


class LockNotAcquired(LockError):
    """The lock could not be acquired before the timeout (or without a quorum)."""


class LockNotOwned(LockError):
    """The lease is no longer held (it expired, or another holder took over).

    Nothing belonging to another holder was touched.
    """


class LockLost(LockError):
    """``hold()`` could not keep its lease; the protected block was cancelled."""
