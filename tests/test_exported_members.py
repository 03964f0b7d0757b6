import headway


def test_all_is_pinned() -> None:
    assert headway.__all__ == [
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


def test_all_is_sorted_and_importable() -> None:
    assert headway.__all__ == sorted(headway.__all__)
    for name in headway.__all__:
        assert getattr(headway, name) is not None
