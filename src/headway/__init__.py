"""headway: idempotency keys, rate limits and distributed locks for ASGI apps."""

from importlib.metadata import version as _version

from headway._clock import FakeClock, MonotonicClock
from headway._errors import (
    BackendUnavailable,
    ConcurrencyLimitExceeded,
    HeadwayError,
    IdempotencyError,
    IdempotencyInProgress,
    IdempotencyKeyReused,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    ResultNotSerializable,
)
from headway.idempotency.events import IdempotencyEvent, IdempotencyEventKind, IdempotencyHook
from headway.idempotency.function import IdempotentDecorator, idempotent_function
from headway.idempotency.middleware import IdempotencyMiddleware, idempotent
from headway.idempotency.serializers import JsonSerializer, Serializer
from headway.idempotency.store import RecordStore
from headway.lock.backends.memory import MemoryLockBackend
from headway.lock.backends.postgres import PostgresLockBackend
from headway.lock.backends.redis.backend import RedisLockBackend
from headway.lock.backends.redis.sync_backend import SyncRedisLockBackend
from headway.lock.backends.redlock import RedlockBackend
from headway.lock.contract import LockBackend, SyncLockBackend
from headway.lock.fencing import fenced_update, fenced_update_statement, fenced_update_sync
from headway.lock.lease import Lease
from headway.lock.lock import Lock, SyncLock
from headway.ratelimit.backends.contract import (
    ConcurrencyBackend,
    RateLimitBackend,
    SyncConcurrencyBackend,
    SyncRateLimitBackend,
)
from headway.ratelimit.backends.memory import MemoryRateLimitBackend, SyncMemoryRateLimitBackend
from headway.ratelimit.backends.redis import RedisRateLimitBackend, SyncRedisRateLimitBackend
from headway.ratelimit.concurrency import ConcurrencyLimiter, SyncConcurrencyLimiter
from headway.ratelimit.decision import Decision, PolicyDecision, Source
from headway.ratelimit.http.decorator import RateLimitDecorator, rate_limit
from headway.ratelimit.http.guard import DecisionHook, RateLimitEvent
from headway.ratelimit.http.identity import ApiKey, AuthenticatedUser, ClientAddress, Identity
from headway.ratelimit.http.middleware import RateLimitMiddleware
from headway.ratelimit.http.rules import LimiterSettings, Rule
from headway.ratelimit.limiter import RateLimiter, SyncRateLimiter
from headway.ratelimit.policies import (
    Concurrency,
    FixedWindow,
    LeakyBucket,
    Policy,
    SlidingCounter,
    SlidingLog,
    TokenBucket,
)
from headway.ratelimit.slots import Admission

__version__ = _version("headway")

__all__ = [
    "Admission",
    "ApiKey",
    "AuthenticatedUser",
    "BackendUnavailable",
    "ClientAddress",
    "Concurrency",
    "ConcurrencyBackend",
    "ConcurrencyLimitExceeded",
    "ConcurrencyLimiter",
    "Decision",
    "DecisionHook",
    "FakeClock",
    "FixedWindow",
    "HeadwayError",
    "IdempotencyError",
    "IdempotencyEvent",
    "IdempotencyEventKind",
    "IdempotencyHook",
    "IdempotencyInProgress",
    "IdempotencyKeyReused",
    "IdempotencyMiddleware",
    "IdempotentDecorator",
    "Identity",
    "JsonSerializer",
    "LeakyBucket",
    "Lease",
    "LimiterSettings",
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
    "PostgresLockBackend",
    "RateLimitBackend",
    "RateLimitDecorator",
    "RateLimitEvent",
    "RateLimitMiddleware",
    "RateLimiter",
    "RecordStore",
    "RedisLockBackend",
    "RedisRateLimitBackend",
    "RedlockBackend",
    "ResultNotSerializable",
    "Rule",
    "Serializer",
    "SlidingCounter",
    "SlidingLog",
    "Source",
    "SyncConcurrencyBackend",
    "SyncConcurrencyLimiter",
    "SyncLock",
    "SyncLockBackend",
    "SyncMemoryRateLimitBackend",
    "SyncRateLimitBackend",
    "SyncRateLimiter",
    "SyncRedisLockBackend",
    "SyncRedisRateLimitBackend",
    "TokenBucket",
    "fenced_update",
    "fenced_update_statement",
    "fenced_update_sync",
    "idempotent",
    "idempotent_function",
    "rate_limit",
]
