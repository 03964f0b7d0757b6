import ast
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import headway


def test_all_is_pinned() -> None:
    assert headway.__all__ == [
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


def test_all_is_sorted_and_importable() -> None:
    assert headway.__all__ == sorted(headway.__all__)
    for name in headway.__all__:
        assert getattr(headway, name) is not None


def _type_checking_imports() -> dict[str, str]:
    """name -> module of the imports under ``if TYPE_CHECKING:`` in ``headway/__init__.py``."""
    tree = ast.parse(Path(headway.__file__).read_text())
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    return {
        alias.name: node.module or ""
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_lazy_table_and_type_checking_imports_name_every_public_name() -> None:
    table = {name: module for module, names in headway._MODULES.items() for name in names}
    assert sorted(table) == headway.__all__
    assert _type_checking_imports() == table
    assert set(headway.__all__) <= set(dir(headway))
    assert headway.__version__ == version("headway")


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        headway.Nope  # noqa: B018


# Run in a fresh interpreter: this one has imported everything already.
_RATE_LIMIT_ONLY = """
import asyncio, sys
import headway
from headway import (
    MemoryRateLimitBackend, RateLimiter, RateLimitMiddleware, Rule, TokenBucket, rate_limit,
)

async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})

async def main():
    backend = MemoryRateLimitBackend()
    limiter = RateLimiter(TokenBucket(1, 60), backend=backend)
    assert (await limiter.hit("k")).allowed and not (await limiter.hit("k")).allowed
    middleware = RateLimitMiddleware(app, rules=[Rule(TokenBucket(1, 60))], backend=backend)
    statuses = []
    async def receive():
        return {"type": "http.request", "body": b""}
    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
             "client": ("127.0.0.1", 1), "query_string": b"", "root_path": ""}
    for _ in range(2):
        await middleware(dict(scope), receive, send)
    assert statuses == [200, 429], statuses

asyncio.run(main())
print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in {MODULES})))
"""


def _loaded_after(code: str) -> set[str]:
    heavy = {"sqlalchemy", "alembic", "aiosqlite"}
    script = code.replace("{MODULES}", repr(heavy))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()
    return {name.split(".")[0] for name in out.split(",") if name}


def test_rate_limiting_never_imports_sqlalchemy() -> None:
    assert _loaded_after(_RATE_LIMIT_ONLY) == set()


def test_idempotency_does_import_sqlalchemy() -> None:
    # The check above can see SQLAlchemy: the idempotency records need it.
    code = "import sys\nfrom headway import IdempotencyMiddleware\n"
    code += 'print(",".join(m for m in sys.modules if m.split(".")[0] in {MODULES}))'
    assert "sqlalchemy" in _loaded_after(code)
