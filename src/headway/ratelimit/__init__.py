"""Rate limiting: policies, the standalone limiter, its backends, the middleware and decorator."""

from ._backend import RateLimitBackend, SyncRateLimitBackend
from ._decision import Decision, PolicyDecision, Source
from ._decorator import RateLimitDecorator, rate_limit
from ._guard import DecisionHook, RateLimitEvent
from ._identity import ApiKey, AuthenticatedUser, ClientAddress, Identity
from ._limiter import RateLimiter, SyncRateLimiter
from ._memory import MemoryRateLimitBackend, SyncMemoryRateLimitBackend
from ._middleware import RateLimitMiddleware
from ._policies import FixedWindow, LeakyBucket, Policy, SlidingCounter, SlidingLog, TokenBucket
from ._redis import RedisRateLimitBackend, SyncRedisRateLimitBackend
from ._rules import Rule

__all__ = [
    "ApiKey",
    "AuthenticatedUser",
    "ClientAddress",
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
    "Source",
    "SyncMemoryRateLimitBackend",
    "SyncRateLimitBackend",
    "SyncRateLimiter",
    "SyncRedisRateLimitBackend",
    "TokenBucket",
    "rate_limit",
]
