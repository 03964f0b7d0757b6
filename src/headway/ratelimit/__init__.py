"""Rate limiting: policies, the standalone limiter, concurrency limits, and their backends."""

from ._backend import (
    ConcurrencyBackend,
    RateLimitBackend,
    SyncConcurrencyBackend,
    SyncRateLimitBackend,
)
from ._concurrency import ConcurrencyLimiter, SyncConcurrencyLimiter
from ._decision import Decision, PolicyDecision, Source
from ._limiter import RateLimiter, SyncRateLimiter
from ._memory import MemoryRateLimitBackend, SyncMemoryRateLimitBackend
from ._policies import (
    Concurrency,
    FixedWindow,
    LeakyBucket,
    Policy,
    SlidingCounter,
    SlidingLog,
    TokenBucket,
)
from ._redis import RedisRateLimitBackend, SyncRedisRateLimitBackend
from ._slots import Admission, Slot

__all__ = [
    "Admission",
    "Concurrency",
    "ConcurrencyBackend",
    "ConcurrencyLimiter",
    "Decision",
    "FixedWindow",
    "LeakyBucket",
    "MemoryRateLimitBackend",
    "Policy",
    "PolicyDecision",
    "RateLimitBackend",
    "RateLimiter",
    "RedisRateLimitBackend",
    "SlidingCounter",
    "SlidingLog",
    "Slot",
    "Source",
    "SyncConcurrencyBackend",
    "SyncConcurrencyLimiter",
    "SyncMemoryRateLimitBackend",
    "SyncRateLimitBackend",
    "SyncRateLimiter",
    "SyncRedisRateLimitBackend",
    "TokenBucket",
]
