"""The MySQL/MariaDB lock backends (``GET_LOCK``): ``MySQLLockBackend`` (async, in
``backend``, whose doc tells the design) and its twin for threads,
``SyncMySQLLockBackend`` (``sync_backend``); what they share is in ``common``."""

from __future__ import annotations

from headway.lock.backends.mysql.backend import MySQLLockBackend
from headway.lock.backends.mysql.common import FENCE_TABLE, lock_name
from headway.lock.backends.mysql.sync_backend import SyncMySQLLockBackend

__all__ = ["FENCE_TABLE", "MySQLLockBackend", "SyncMySQLLockBackend", "lock_name"]
