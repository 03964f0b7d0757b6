"""What ``inspect`` reads on etcd: a request key's value carries its owner, its lease
the time left.

A key's value is what its request needs there (a permit's capacity; nothing for the
others) and, when its ``Lock`` has an owner, a space and the owner (owners have no
spaces): ``"4 worker-3"``, ``" worker-3"``. Holders' time left is their lease's
(``lease/timetolive``), in etcd's whole seconds: a key's lease is its backend's session
for that TTL (``session.py``), so this is the latest the lock ends if its process stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headway.lock.backends.etcd.codec import NOT_FOUND, EtcdError, unb64
from headway.lock.introspection import Holder, HolderMode, check_owner, current_owner

if TYPE_CHECKING:
    from headway.lock.backends.etcd.transport import Transport

__all__ = ["holders", "parse_value", "value"]


def value(needed: str = "") -> str:
    """The value of a request key put now: ``needed``, then the acquire's owner if any."""
    owner = current_owner()
    return needed if owner is None else f"{needed} {owner}"


def parse_value(raw: str) -> tuple[str, str | None]:
    """A request key's value (decoded) as what its request needs and its owner."""
    needed, _, owner = raw.partition(" ")
    try:
        return needed, check_owner(owner) if owner else None
    except ValueError:  # not a value this version writes
        return needed, None


async def _left(gateway: Transport, lease: str) -> float | None:
    try:
        reply = await gateway.call("lease/timetolive", {"ID": lease})
    except EtcdError as exc:
        if exc.code != NOT_FOUND:
            raise
        return 0.0  # it ran out as we asked: its key goes with it
    ttl = int(reply.get("TTL", -1))  # -1: the lease is gone
    return float(ttl) if ttl >= 0 else 0.0


async def holders(
    gateway: Transport, kvs: Sequence[tuple[dict[str, Any], HolderMode]]
) -> tuple[Holder, ...]:
    """The ``Holder`` of each request key (``kv/range`` entries, values included) and
    mode, their leases asked at once."""
    lefts = await asyncio.gather(*(_left(gateway, str(kv.get("lease", "0"))) for kv, _ in kvs))
    made = []
    for (kv, mode), left in zip(kvs, lefts, strict=True):
        _, owner = parse_value(unb64(kv["value"]) if kv.get("value") else "")
        made.append(Holder(int(kv["create_revision"]), left, owner, mode))
    return tuple(made)
