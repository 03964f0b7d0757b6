import headway


def test_all_is_pinned() -> None:
    assert headway.__all__ == [
        "BackendUnavailable",
        "Decision",
        "FakeClock",
        "FixedWindow",
        "HeadwayError",
        "IdempotencyMiddleware",
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
        "PostgresLockBackend",
        "RateLimitBackend",
        "RateLimiter",
        "RecordStore",
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
        "fenced_update",
        "fenced_update_statement",
        "fenced_update_sync",
        "idempotent",
    ]


def test_all_is_sorted_and_importable() -> None:
    assert headway.__all__ == sorted(headway.__all__)
    for name in headway.__all__:
        assert getattr(headway, name) is not None
