"""headway: idempotency keys, rate limits and distributed locks for ASGI apps."""

from importlib.metadata import version as _version

from ._clock import FakeClock, MonotonicClock
from ._errors import (
    BackendUnavailable,
    HeadwayError,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)
from .lock import (
    Lease,
    Lock,
    LockBackend,
    MemoryLockBackend,
    RedisLockBackend,
    RedlockBackend,
    SyncLock,
    SyncLockBackend,
    SyncRedisLockBackend,
)

__version__ = _version("headway")

__all__ = [
    "BackendUnavailable",
    "FakeClock",
    "HeadwayError",
    "Lease",
    "Lock",
    "LockBackend",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "MemoryLockBackend",
    "MonotonicClock",
    "RedisLockBackend",
    "RedlockBackend",
    "SyncLock",
    "SyncLockBackend",
    "SyncRedisLockBackend",
]
