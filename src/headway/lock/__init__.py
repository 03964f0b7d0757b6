"""The distributed lock shared by idempotency and rate limiting."""

from ._backend import LockBackend, SyncLockBackend
from ._lease import Lease
from ._lock import Lock, SyncLock
from ._memory import MemoryLockBackend
from ._redis import RedisLockBackend, SyncRedisLockBackend
from ._redlock import RedlockBackend

__all__ = [
    "Lease",
    "Lock",
    "LockBackend",
    "MemoryLockBackend",
    "RedisLockBackend",
    "RedlockBackend",
    "SyncLock",
    "SyncLockBackend",
    "SyncRedisLockBackend",
]
