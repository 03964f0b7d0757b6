"""The distributed lock shared by idempotency and rate limiting."""

from ._backend import LockBackend, SyncLockBackend
from ._fencing import fenced_update, fenced_update_statement, fenced_update_sync
from ._lease import Lease
from ._lock import Lock, SyncLock
from ._memory import MemoryLockBackend
from ._postgres import PostgresLockBackend
from ._redis import RedisLockBackend, SyncRedisLockBackend
from ._redlock import RedlockBackend

__all__ = [
    "Lease",
    "Lock",
    "LockBackend",
    "MemoryLockBackend",
    "PostgresLockBackend",
    "RedisLockBackend",
    "RedlockBackend",
    "SyncLock",
    "SyncLockBackend",
    "SyncRedisLockBackend",
    "fenced_update",
    "fenced_update_statement",
    "fenced_update_sync",
]
