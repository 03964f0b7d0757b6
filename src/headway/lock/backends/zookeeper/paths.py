"""The ZooKeeper lock's node names: one folder per resource, one sequential node per waiter.

``<prefix>/<segment>/<token>-<sequence>``: ``segment`` is the resource escaped as
the Redis backend escapes it (``headway._keys.segment``), except that ``/`` (a path
separator here) and the names ``.`` and ``..`` are hashed too; ``token`` is the 128-bit
token the waiter will hold, so a create whose reply was lost can be found again; the
sequence suffix is ZooKeeper's, ten digits, and orders the queue.

A resource's read-write lock and semaphore queue in folders below its exclusive lock's
(``family_path``): ``<prefix>/<segment>/rw/read-<token>-<sequence>`` (``write-``), and
``<prefix>/<segment>/permits/permit-<n>-<token>-<sequence>`` with ``n`` the permits the
request asked for. The exclusive lock's queue ignores these folders (no sequence suffix).
"""

from __future__ import annotations

import hashlib
import re

from headway._keys import segment

__all__ = ["check_prefix", "family_path", "resource_path", "sequence", "token_of"]

_PREFIX = re.compile(r"(/[A-Za-z0-9_.\-@]+)+")


def check_prefix(prefix: str) -> str:
    """Validate the folder every lock lives under (``/headway/locks``); return it."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f"prefix must be an absolute ZooKeeper path like /headway/locks, got {prefix!r}"
        )
    if any(part in {".", ".."} for part in prefix.split("/")) or prefix == "/zookeeper":
        raise ValueError(f"prefix {prefix!r} is not a usable ZooKeeper path")
    return prefix


def resource_path(prefix: str, resource: str) -> str:
    """The folder holding ``resource``'s waiters, its name safe for ZooKeeper."""
    name = segment(resource)
    if "/" in name or name in {".", ".."}:
        digest = hashlib.blake2b(resource.encode("utf-8", "surrogatepass"), digest_size=16)
        name = "~" + digest.hexdigest()
    return f"{prefix}/{name}"


def family_path(prefix: str, resource: str, family: str) -> str:
    """The folder of ``resource``'s queue in a lock ``family`` ("rw" or "permits")."""
    return f"{resource_path(prefix, resource)}/{family}"


def sequence(name: str) -> int:
    """The queue position of a waiter's node (its ZooKeeper sequence suffix)."""
    _, _, digits = name.rpartition("-")
    return int(digits) if digits.isdigit() else -1


def token_of(name: str) -> str:
    """The token a waiter's node was created for ("" for a family's folder)."""
    parts = name.rsplit("-", 2)
    return parts[-2] if len(parts) > 1 else ""
