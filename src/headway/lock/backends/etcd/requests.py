"""The key-value requests the etcd lock backends send, as etcd's JSON bodies.

Keys and ranges travel base64-encoded (``codec.b64``); every range over a resource's
request keys is sorted by create revision, the queue's order. The backends
(``backend.py``, ``modes.py``) decide what to send and read the replies; what each
request is stays here.
"""

from __future__ import annotations

import hashlib
from typing import Any

from headway.lock.backends.etcd.codec import b64

__all__ = ["ahead_of", "key_id", "listing", "newest_two", "prefix_end", "put_once", "rebind"]


def key_id(token: str) -> int:
    """The id in a lease token's key: positive, non-zero, 63 bits."""
    digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
    return (int.from_bytes(digest) >> 1) or 1


def prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with ``prefix`` (which ends in "/")."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def listing(prefix: str, keys_only: bool) -> dict[str, Any]:
    """A range over the request keys under ``prefix``, oldest first."""
    return {
        "key": b64(prefix),
        "range_end": b64(prefix_end(prefix)),
        "sort_order": "ASCEND",
        "sort_target": "CREATE",
        "keys_only": keys_only,
    }


def newest_two(prefix: str) -> dict[str, Any]:
    """A range over the two newest request keys under ``prefix``, keys only."""
    return {
        "key": b64(prefix),
        "range_end": b64(prefix_end(prefix)),
        "sort_order": "DESCEND",
        "sort_target": "CREATE",
        "limit": "2",
        "keys_only": True,
    }


def put_once(
    key: str,
    value: str,
    lease: int,
    then: dict[str, Any],
    otherwise: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``kv/txn`` that puts ``key`` (bound to ``lease``) only if it does not exist, then
    runs the range ``then``; if it existed (a retry after a lost reply), runs the range
    ``otherwise`` (default: ``then``)."""
    put = {"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}}
    return {
        "compare": [{"key": b64(key), "target": "CREATE", "result": "EQUAL"}],
        "success": [put, {"request_range": then}],
        "failure": [{"request_range": then if otherwise is None else otherwise}],
    }


def ahead_of(prefix: str, key: str, revision: int) -> dict[str, Any]:
    """A ``kv/txn`` that, if ``key`` still has create revision ``revision``, reads the key
    created just before it under ``prefix`` (none: ``key`` is first)."""
    return {
        "compare": [
            {
                "key": b64(key),
                "target": "CREATE",
                "result": "EQUAL",
                "create_revision": str(revision),
            }
        ],
        "success": [
            {
                "request_range": {
                    "key": b64(prefix),
                    "range_end": b64(prefix_end(prefix)),
                    "max_create_revision": str(revision - 1),
                    "sort_order": "DESCEND",
                    "sort_target": "CREATE",
                    "limit": "1",
                    "keys_only": True,
                }
            }
        ],
    }


def rebind(key: str, old_lease: int, new_lease: int) -> dict[str, Any]:
    """A ``kv/txn`` that binds ``key`` to ``new_lease`` if it is still bound to
    ``old_lease``, keeping its value and create revision."""
    return {
        "compare": [
            {"key": b64(key), "target": "LEASE", "result": "EQUAL", "lease": str(old_lease)}
        ],
        "success": [
            {"request_put": {"key": b64(key), "lease": str(new_lease), "ignore_value": True}}
        ],
    }
