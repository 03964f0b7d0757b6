"""headway: idempotency keys, rate limits and distributed locks for ASGI apps.

Every public name is imported from here, and only when first used (PEP 562): rate
limiting alone never loads SQLAlchemy, Alembic or aiosqlite, which the idempotency
records and the PostgreSQL and MySQL locks need.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time ``__getattr__`` imports
    __version__: str

    from headway._clock import FakeClock, MonotonicClock
    from headway._errors import (
        BackendUnavailable,
        ConcurrencyLimitExceeded,
        DatabaseNotMigrated,
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
    from headway.idempotency.callers import ScopeFunction, by_credentials
    from headway.idempotency.contract import RecordBackend
    from headway.idempotency.events import IdempotencyEvent, IdempotencyEventKind, IdempotencyHook
    from headway.idempotency.fingerprints import (
        FingerprintFunction,
        default_fingerprint,
        fingerprint_fields,
    )
    from headway.idempotency.function import IdempotentDecorator, idempotent_function
    from headway.idempotency.middleware import IdempotencyMiddleware, idempotent
    from headway.idempotency.record import (
        Claim,
        ClaimOutcome,
        ForgetOutcome,
        Record,
        RecordState,
        RecordStatus,
        StoredResponse,
    )
    from headway.idempotency.serializers import JsonSerializer, Serializer
    from headway.idempotency.store import RecordStore
    from headway.lock.backends.etcd.backend import EtcdLockBackend
    from headway.lock.backends.memory import MemoryLockBackend
    from headway.lock.backends.mysql.backend import MySQLLockBackend
    from headway.lock.backends.mysql.sync_backend import SyncMySQLLockBackend
    from headway.lock.backends.postgres import PostgresLockBackend
    from headway.lock.backends.redis.backend import RedisLockBackend
    from headway.lock.backends.redis.sync_backend import SyncRedisLockBackend
    from headway.lock.backends.redlock import RedlockBackend
    from headway.lock.backends.sync_twins import (
        SyncEtcdLockBackend,
        SyncPostgresLockBackend,
        SyncRedlockBackend,
        SyncZooKeeperLockBackend,
    )
    from headway.lock.backends.zookeeper.backend import ZooKeeperLockBackend
    from headway.lock.capabilities import (
        MultiAcquireBackend,
        SyncWindowClaimBackend,
        WindowClaimBackend,
    )
    from headway.lock.contract import (
        LockBackend,
        ModalLockBackend,
        SyncLockBackend,
        SyncModalLockBackend,
    )
    from headway.lock.decorator import LockDecorator, SyncLockDecorator, current_lease, locked
    from headway.lock.election import Election, Leader, Leadership
    from headway.lock.election_sync import SyncElection, SyncLeadership
    from headway.lock.events import LockEvent, LockEventKind, LockHook
    from headway.lock.fencing import fenced_update, fenced_update_statement, fenced_update_sync
    from headway.lock.introspection import (
        Holder,
        InspectableLockBackend,
        LockState,
        SyncInspectableLockBackend,
    )
    from headway.lock.lease import Lease
    from headway.lock.lock import Lock
    from headway.lock.modes import LockMode
    from headway.lock.multi import MultiLock
    from headway.lock.once import RunOnceDecorator, Skipped, run_once
    from headway.lock.shared import ReadWriteLock, Semaphore, SyncReadWriteLock, SyncSemaphore
    from headway.lock.sync_lock import SyncLock
    from headway.lock.sync_multi import SyncMultiLock
    from headway.metrics.otel import OpenTelemetryMetrics
    from headway.metrics.prometheus import PrometheusMetrics
    from headway.ratelimit.backends.contract import (
        ConcurrencyBackend,
        RateLimitBackend,
        SyncConcurrencyBackend,
        SyncRateLimitBackend,
        decide_states,
        state_names,
    )
    from headway.ratelimit.backends.leasing_contract import (
        LeasingBackend,
        SyncLeasingBackend,
        lease_states,
    )
    from headway.ratelimit.backends.memory import MemoryRateLimitBackend, SyncMemoryRateLimitBackend
    from headway.ratelimit.backends.redis import RedisRateLimitBackend
    from headway.ratelimit.backends.settling import (
        ReservingBackend,
        SyncReservingBackend,
        reserve_states,
        settle_states,
    )
    from headway.ratelimit.backends.sync_redis import SyncRedisRateLimitBackend
    from headway.ratelimit.concurrency import ConcurrencyLimiter, SyncConcurrencyLimiter
    from headway.ratelimit.decision import Decision, PolicyDecision, Source
    from headway.ratelimit.http.decorator import RateLimitDecorator, rate_limit
    from headway.ratelimit.http.dependency import RateLimitDependency, RateLimitRefused
    from headway.ratelimit.http.identity import (
        ApiKey,
        AuthenticatedUser,
        ClientAddress,
        Identity,
        SessionCookie,
    )
    from headway.ratelimit.http.metering import Meter, Metering
    from headway.ratelimit.http.middleware import RateLimitMiddleware
    from headway.ratelimit.http.refusals import RefusalContext, RefusalHook
    from headway.ratelimit.http.reporting import DecisionHook, RateLimitEvent
    from headway.ratelimit.http.rules import LimiterSettings, PolicyFunction, Rule
    from headway.ratelimit.http.websocket import WebSocketRateLimitMiddleware
    from headway.ratelimit.http.websocket_rules import WebSocketRule
    from headway.ratelimit.leasing import Leasing
    from headway.ratelimit.limiter import RateLimiter
    from headway.ratelimit.policies import (
        Concurrency,
        FixedWindow,
        LeakyBucket,
        Policy,
        SlidingCounter,
        SlidingLog,
        TokenBucket,
    )
    from headway.ratelimit.reservation import Reservation
    from headway.ratelimit.slots import Admission, Grant
    from headway.ratelimit.sync_limiter import SyncRateLimiter

#: Where each public name lives: module -> names. Keep it in step with the imports above
#: (``tests/test_exported_members.py`` checks both against ``__all__``).
_MODULES: dict[str, tuple[str, ...]] = {
    "headway._clock": ("FakeClock", "MonotonicClock"),
    "headway._errors": (
        "BackendUnavailable",
        "ConcurrencyLimitExceeded",
        "DatabaseNotMigrated",
        "HeadwayError",
        "IdempotencyError",
        "IdempotencyInProgress",
        "IdempotencyKeyReused",
        "ResultNotSerializable",
        "LockError",
        "LockLost",
        "LockNotAcquired",
        "LockNotOwned",
    ),
    "headway.idempotency.callers": ("ScopeFunction", "by_credentials"),
    "headway.idempotency.contract": ("RecordBackend",),
    "headway.idempotency.events": ("IdempotencyEvent", "IdempotencyEventKind", "IdempotencyHook"),
    "headway.idempotency.fingerprints": (
        "FingerprintFunction",
        "default_fingerprint",
        "fingerprint_fields",
    ),
    "headway.idempotency.middleware": ("IdempotencyMiddleware", "idempotent"),
    "headway.idempotency.record": (
        "Claim",
        "ClaimOutcome",
        "ForgetOutcome",
        "Record",
        "RecordState",
        "RecordStatus",
        "StoredResponse",
    ),
    "headway.idempotency.store": ("RecordStore",),
    "headway.lock.backends.memory": ("MemoryLockBackend",),
    "headway.lock.backends.mysql.backend": ("MySQLLockBackend",),
    "headway.lock.backends.mysql.sync_backend": ("SyncMySQLLockBackend",),
    "headway.lock.backends.postgres": ("PostgresLockBackend",),
    "headway.lock.backends.redis.backend": ("RedisLockBackend",),
    "headway.lock.backends.redis.sync_backend": ("SyncRedisLockBackend",),
    "headway.lock.backends.redlock": ("RedlockBackend",),
    "headway.lock.backends.sync_twins": (
        "SyncEtcdLockBackend",
        "SyncPostgresLockBackend",
        "SyncRedlockBackend",
        "SyncZooKeeperLockBackend",
    ),
    "headway.lock.capabilities": (
        "MultiAcquireBackend",
        "SyncWindowClaimBackend",
        "WindowClaimBackend",
    ),
    "headway.lock.contract": (
        "LockBackend",
        "ModalLockBackend",
        "SyncLockBackend",
        "SyncModalLockBackend",
    ),
    "headway.lock.decorator": ("LockDecorator", "SyncLockDecorator", "current_lease", "locked"),
    "headway.lock.election": ("Election", "Leader", "Leadership"),
    "headway.lock.election_sync": ("SyncElection", "SyncLeadership"),
    "headway.lock.fencing": ("fenced_update", "fenced_update_statement", "fenced_update_sync"),
    "headway.lock.introspection": (
        "Holder",
        "InspectableLockBackend",
        "LockState",
        "SyncInspectableLockBackend",
    ),
    "headway.lock.lease": ("Lease",),
    "headway.lock.lock": ("Lock",),
    "headway.lock.modes": ("LockMode",),
    "headway.lock.multi": ("MultiLock",),
    "headway.lock.once": ("RunOnceDecorator", "Skipped", "run_once"),
    "headway.lock.shared": ("ReadWriteLock", "Semaphore", "SyncReadWriteLock", "SyncSemaphore"),
    "headway.lock.sync_lock": ("SyncLock",),
    "headway.lock.sync_multi": ("SyncMultiLock",),
    "headway.ratelimit.backends.contract": (
        "ConcurrencyBackend",
        "RateLimitBackend",
        "SyncConcurrencyBackend",
        "SyncRateLimitBackend",
        "decide_states",
        "state_names",
    ),
    "headway.ratelimit.backends.leasing_contract": (
        "LeasingBackend",
        "SyncLeasingBackend",
        "lease_states",
    ),
    "headway.ratelimit.backends.memory": ("MemoryRateLimitBackend", "SyncMemoryRateLimitBackend"),
    "headway.ratelimit.backends.redis": ("RedisRateLimitBackend",),
    "headway.ratelimit.backends.sync_redis": ("SyncRedisRateLimitBackend",),
    "headway.ratelimit.concurrency": ("ConcurrencyLimiter", "SyncConcurrencyLimiter"),
    "headway.ratelimit.decision": ("Decision", "PolicyDecision", "Source"),
    "headway.ratelimit.http.decorator": ("RateLimitDecorator", "rate_limit"),
    "headway.ratelimit.http.identity": (
        "ApiKey",
        "AuthenticatedUser",
        "ClientAddress",
        "Identity",
        "SessionCookie",
    ),
    "headway.ratelimit.http.middleware": ("RateLimitMiddleware",),
    "headway.ratelimit.http.reporting": ("DecisionHook", "RateLimitEvent"),
    "headway.ratelimit.http.rules": ("LimiterSettings", "PolicyFunction", "Rule"),
    "headway.ratelimit.http.websocket": ("WebSocketRateLimitMiddleware",),
    "headway.ratelimit.http.websocket_rules": ("WebSocketRule",),
    "headway.ratelimit.leasing": ("Leasing",),
    "headway.ratelimit.limiter": ("RateLimiter",),
    "headway.ratelimit.reservation": ("Reservation",),
    "headway.ratelimit.http.metering": ("Meter", "Metering"),
    "headway.ratelimit.backends.settling": (
        "ReservingBackend",
        "SyncReservingBackend",
        "reserve_states",
        "settle_states",
    ),
    "headway.ratelimit.sync_limiter": ("SyncRateLimiter",),
    "headway.ratelimit.policies": (
        "Concurrency",
        "FixedWindow",
        "LeakyBucket",
        "Policy",
        "SlidingCounter",
        "SlidingLog",
        "TokenBucket",
    ),
    "headway.ratelimit.slots": ("Admission", "Grant"),
    "headway.ratelimit.http.dependency": (
        "RateLimitDependency",
        "RateLimitRefused",
    ),
    "headway.ratelimit.http.refusals": (
        "RefusalContext",
        "RefusalHook",
    ),
    "headway.lock.events": (
        "LockEvent",
        "LockEventKind",
        "LockHook",
    ),
    "headway.metrics.otel": ("OpenTelemetryMetrics",),
    "headway.metrics.prometheus": ("PrometheusMetrics",),
    "headway.lock.backends.etcd.backend": ("EtcdLockBackend",),
    "headway.lock.backends.zookeeper.backend": ("ZooKeeperLockBackend",),
    "headway.idempotency.function": (
        "IdempotentDecorator",
        "idempotent_function",
    ),
    "headway.idempotency.serializers": (
        "JsonSerializer",
        "Serializer",
    ),
}
_SOURCE = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "Admission",
    "ApiKey",
    "AuthenticatedUser",
    "BackendUnavailable",
    "Claim",
    "ClaimOutcome",
    "ClientAddress",
    "Concurrency",
    "ConcurrencyBackend",
    "ConcurrencyLimitExceeded",
    "ConcurrencyLimiter",
    "DatabaseNotMigrated",
    "Decision",
    "DecisionHook",
    "Election",
    "EtcdLockBackend",
    "FakeClock",
    "FingerprintFunction",
    "FixedWindow",
    "ForgetOutcome",
    "Grant",
    "HeadwayError",
    "Holder",
    "IdempotencyError",
    "IdempotencyEvent",
    "IdempotencyEventKind",
    "IdempotencyHook",
    "IdempotencyInProgress",
    "IdempotencyKeyReused",
    "IdempotencyMiddleware",
    "IdempotentDecorator",
    "Identity",
    "InspectableLockBackend",
    "JsonSerializer",
    "Leader",
    "Leadership",
    "LeakyBucket",
    "Lease",
    "Leasing",
    "LeasingBackend",
    "LimiterSettings",
    "Lock",
    "LockBackend",
    "LockDecorator",
    "LockError",
    "LockEvent",
    "LockEventKind",
    "LockHook",
    "LockLost",
    "LockMode",
    "LockNotAcquired",
    "LockNotOwned",
    "LockState",
    "MemoryLockBackend",
    "MemoryRateLimitBackend",
    "Meter",
    "Metering",
    "ModalLockBackend",
    "MonotonicClock",
    "MultiAcquireBackend",
    "MultiLock",
    "MySQLLockBackend",
    "OpenTelemetryMetrics",
    "Policy",
    "PolicyDecision",
    "PolicyFunction",
    "PostgresLockBackend",
    "PrometheusMetrics",
    "RateLimitBackend",
    "RateLimitDecorator",
    "RateLimitDependency",
    "RateLimitEvent",
    "RateLimitMiddleware",
    "RateLimitRefused",
    "RateLimiter",
    "ReadWriteLock",
    "Record",
    "RecordBackend",
    "RecordState",
    "RecordStatus",
    "RecordStore",
    "RedisLockBackend",
    "RedisRateLimitBackend",
    "RedlockBackend",
    "RefusalContext",
    "RefusalHook",
    "Reservation",
    "ReservingBackend",
    "ResultNotSerializable",
    "Rule",
    "RunOnceDecorator",
    "ScopeFunction",
    "Semaphore",
    "Serializer",
    "SessionCookie",
    "Skipped",
    "SlidingCounter",
    "SlidingLog",
    "Source",
    "StoredResponse",
    "SyncConcurrencyBackend",
    "SyncConcurrencyLimiter",
    "SyncElection",
    "SyncEtcdLockBackend",
    "SyncInspectableLockBackend",
    "SyncLeadership",
    "SyncLeasingBackend",
    "SyncLock",
    "SyncLockBackend",
    "SyncLockDecorator",
    "SyncMemoryRateLimitBackend",
    "SyncModalLockBackend",
    "SyncMultiLock",
    "SyncMySQLLockBackend",
    "SyncPostgresLockBackend",
    "SyncRateLimitBackend",
    "SyncRateLimiter",
    "SyncReadWriteLock",
    "SyncRedisLockBackend",
    "SyncRedisRateLimitBackend",
    "SyncRedlockBackend",
    "SyncReservingBackend",
    "SyncSemaphore",
    "SyncWindowClaimBackend",
    "SyncZooKeeperLockBackend",
    "TokenBucket",
    "WebSocketRateLimitMiddleware",
    "WebSocketRule",
    "WindowClaimBackend",
    "ZooKeeperLockBackend",
    "by_credentials",
    "current_lease",
    "decide_states",
    "default_fingerprint",
    "fenced_update",
    "fenced_update_statement",
    "fenced_update_sync",
    "fingerprint_fields",
    "idempotent",
    "idempotent_function",
    "lease_states",
    "locked",
    "rate_limit",
    "reserve_states",
    "run_once",
    "settle_states",
    "state_names",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use, then keep it in the module (no second lookup)."""
    module = _SOURCE.get(name)
    if module is None:
        if name == "__version__":
            from importlib.metadata import version

            value: Any = version("headway")
        else:
            raise AttributeError(f"module 'headway' has no attribute {name!r}")
    else:
        value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "__version__"})
