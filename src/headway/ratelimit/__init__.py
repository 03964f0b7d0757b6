"""Rate limiting: policies, the standalone limiter, and its backends."""

from ._backend import RateLimitBackend, SyncRateLimitBackend
from ._decision import Decision, PolicyDecision, Source
from ._limiter import RateLimiter, SyncRateLimiter
from ._memory import MemoryRateLimitBackend, SyncMemoryRateLimitBackend
from ._policies import FixedWindow, LeakyBucket, Policy, SlidingCounter, SlidingLog, TokenBucket
from ._redis import RedisRateLimitBackend, SyncRedisRateLimitBackend

__all__ = [
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
    "Source",
    "SyncMemoryRateLimitBackend",
    "SyncRateLimitBackend",
    "SyncRateLimiter",
    "SyncRedisRateLimitBackend",
    "TokenBucket",
]
