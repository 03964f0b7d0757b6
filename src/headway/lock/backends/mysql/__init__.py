"""The MySQL/MariaDB lock backends (``GET_LOCK``): ``MySQLLockBackend`` (async, in
``backend``, whose doc tells the design);
what a sync twin would share is in ``common``."""

from __future__ import annotations

from headway.lock.backends.mysql.backend import MySQLLockBackend
from headway.lock.backends.mysql.common import FENCE_TABLE, lock_name

__all__ = ["FENCE_TABLE", "MySQLLockBackend", "lock_name"]
