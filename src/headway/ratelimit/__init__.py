"""Rate limiting: policies, limiters, concurrency limits, their backends, middleware, decorator."""

from ._backend import (
    ConcurrencyBackend,
    RateLimitBackend,
    SyncConcurrencyBackend,
    SyncRateLimitBackend,
)
from ._concurrency import ConcurrencyLimiter, SyncConcurrencyLimiter
from ._decision import Decision, PolicyDecision, Source
from ._decorator import RateLimitDecorator, rate_limit
from ._guard import DecisionHook, RateLimitEvent
from ._identity import ApiKey, AuthenticatedUser, ClientAddress, Identity
from ._limiter import RateLimiter, SyncRateLimiter
from ._memory import MemoryRateLimitBackend, SyncMemoryRateLimitBackend
from ._middleware import RateLimitMiddleware
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
from ._rules import Rule
from ._slots import Admission, Slot

__all__ = [
    "Admission",
    "ApiKey",
    "AuthenticatedUser",
    "ClientAddress",
    "Concurrency",
    "ConcurrencyBackend",
    "ConcurrencyLimiter",
    "Decision",
    "DecisionHook",
    "FixedWindow",
    "Identity",
    "LeakyBucket",
    "MemoryRateLimitBackend",
    "Policy",
    "PolicyDecision",
    "RateLimitBackend",
    "RateLimitDecorator",
    "RateLimitEvent",
    "RateLimitMiddleware",
    "RateLimiter",
    "RedisRateLimitBackend",
    "Rule",
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
    "rate_limit",
]
