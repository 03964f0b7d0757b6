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
from .ratelimit import (
    Decision,
    FixedWindow,
    LeakyBucket,
    MemoryRateLimitBackend,
    Policy,
    PolicyDecision,
    RateLimitBackend,
    RateLimiter,
    RedisRateLimitBackend,
    SlidingCounter,
    SlidingLog,
    Source,
    SyncMemoryRateLimitBackend,
    SyncRateLimitBackend,
    SyncRateLimiter,
    SyncRedisRateLimitBackend,
    TokenBucket,
)

__version__ = _version("headway")

__all__ = [
    "BackendUnavailable",
    "Decision",
    "FakeClock",
    "FixedWindow",
    "HeadwayError",
    "LeakyBucket",
    "Lease",
    "Lock",
    "LockBackend",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "MemoryLockBackend",
    "MemoryRateLimitBackend",
    "MonotonicClock",
    "Policy",
    "PolicyDecision",
    "RateLimitBackend",
    "RateLimiter",
    "RedisLockBackend",
    "RedisRateLimitBackend",
    "RedlockBackend",
    "SlidingCounter",
    "SlidingLog",
    "Source",
    "SyncLock",
    "SyncLockBackend",
    "SyncMemoryRateLimitBackend",
    "SyncRateLimitBackend",
    "SyncRateLimiter",
    "SyncRedisLockBackend",
    "SyncRedisRateLimitBackend",
    "TokenBucket",
]
