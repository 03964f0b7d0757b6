"""The Redis lock's keys and scripts, and the pure helpers that build their calls.

Every key of one lock shares a hash tag (``headway:{lock:<resource>}:...``),
so the scripts run on Redis Cluster too. A resource that carries a hash tag of its
own (``{order:42}:items``, Redis's rule) has its keys under that tag instead
(``headway:{lock:order:42}:<resource>:...``, both parts escaped as ``_keys`` does), so
the locks of names that share a tag share a slot, and ``MultiLock`` takes them in one
script (``acquire_many``). Redlock runs the same scripts on
each of its nodes. On a Cluster the waiters listen on a sharded channel
(``...:swake``, SSUBSCRIBE on the shard that owns the lock's slot), elsewhere
on a classic one (``...:wake``); the scripts publish by the name's ending.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot

from headway._keys import hash_tag, segment, tag_base, tagged
from headway._redis.scripts import Script
from headway.lock.flow import PLACE_MS, Try
from headway.lock.introspection import Holder, LockState, owner_of

__all__ = [
    "ACQUIRE",
    "ACQUIRE_MANY",
    "EXTEND",
    "FENCE_RAISE",
    "INSPECT",
    "LEAVE",
    "RELEASE",
    "RELEASE_MANY",
    "acquire_call",
    "acquire_many_call",
    "handed_to",
    "inspect_call",
    "leave_call",
    "lock_keys",
    "lock_state",
    "one_slot",
    "release_call",
    "release_many_call",
    "text",
]

_HANDOFF = ("clock", "lock/handoff")
ACQUIRE = Script("lock/acquire", include=_HANDOFF)
# Giving a lock back (or keeping it) must work on a Redis out of memory: ``allow_oom``.
RELEASE = Script("lock/release", include=_HANDOFF, allow_oom=True)
EXTEND = Script("lock/extend", allow_oom=True)
LEAVE = Script("lock/leave", include=_HANDOFF, allow_oom=True)
FENCE_RAISE = Script("lock/fence_raise")
INSPECT = Script("lock/inspect", include=("clock",))
ACQUIRE_MANY = Script("lock/acquire_many", include=_HANDOFF)
RELEASE_MANY = Script("lock/release_many", include=_HANDOFF, allow_oom=True)


@dataclass(frozen=True, slots=True)
class LockKeys:
    """One lock's keys (see the scripts' headers) and each script's key tuple."""

    owner: str
    fence: str
    queue: str
    places: str
    channel: str
    # What each script is called with (tuples: the pipelined connection packs them once).
    acquire: tuple[str, ...]
    release: tuple[str, ...]
    leave: tuple[str, ...]
    extend: tuple[str, ...]
    inspect: tuple[str, ...]


@functools.lru_cache(maxsize=4096)
def lock_keys(resource: str, sharded: bool = False) -> LockKeys:
    """The keys (and wake-up channel) of one lock, all under one hash tag.

    ``sharded``: the channel is a sharded one (for Redis Cluster clients).
    """
    wake = "swake" if sharded else "wake"
    parts = ("owner", "fence", "queue", "places", "released", wake)
    tag = hash_tag(resource)
    if tag is None:
        names = tagged("lock", resource, *parts)
    else:
        # The resource (escaped: it holds "{") after the user's tag; never a bare part
        # name, so no key of a tagged resource is an untagged one's.
        base = f"{tag_base('lock', tag)}{segment(resource)}:"
        names = [base + part for part in parts]
    owner, fence, queue, places, released, channel = names
    return LockKeys(
        owner,
        fence,
        queue,
        places,
        channel,
        acquire=(owner, fence, queue, places),
        release=(owner, queue, places, released, fence),
        leave=(owner, queue, places, fence),
        extend=(owner,),
        inspect=(owner, fence, places),
    )


def acquire_call(
    resource: str, step: Try, floor: int = 0, sharded: bool = False
) -> tuple[tuple[str, ...], list[Any]]:
    """Keys and arguments of ``lock/acquire`` for one attempt."""
    k = lock_keys(resource, sharded)
    return k.acquire, [step.token, step.ttl_ms, step.waiter, step.place_ms, floor, k.channel]


def release_call(
    resource: str,
    token: str,
    node: str = "",
    retried: bool = True,
    riders: Sequence[str] = (),
    sharded: bool = False,
) -> tuple[tuple[str, ...], list[Any]]:
    """Keys and arguments of one ``lock/release`` call.

    ``node`` names the releasing client: its own waiters are handed the lock without
    a message on the channel, as it tells them itself. A client that may send the
    call again (``retried``: redis-py retries) gives it an id, so the script can
    recognise the repeat. ``riders`` are waiter ids the release queues (see
    ``riders.py``). ``sharded`` as in ``lock_keys``.
    """
    k = lock_keys(resource, sharded)
    call = secrets.token_hex(8) if retried else ""
    queue = (PLACE_MS, *riders) if riders else ()
    return k.release, [token, k.channel, call, node, *queue]


def handed_to(reply: Any) -> tuple[str, int, bool] | None:
    """The waiter and fence a ``lock/release`` reply handed the lock to, if any, and
    whether the release left the other riders to ride on that waiter's release."""
    if isinstance(reply, list):  # {1, waiter, fence, left}; a plain 1 or 0 otherwise
        return text(reply[1]), int(reply[2]), int(reply[3]) == 1
    return None


def leave_call(
    resource: str, waiter: str, sharded: bool = False
) -> tuple[tuple[str, ...], list[Any]]:
    """Keys and arguments of one ``lock/leave`` call."""
    k = lock_keys(resource, sharded)
    return k.leave, [waiter, k.channel]


def inspect_call(resource: str) -> tuple[tuple[str, ...], list[Any]]:
    """Keys and arguments of ``lock/inspect`` (read-only: no channel, no arguments)."""
    return lock_keys(resource).inspect, []


def lock_state(resource: str, reply: Any, riding: int = 0) -> LockState:
    """The ``LockState`` a ``lock/inspect`` reply tells (the token shown only as its
    owner), with ``riding`` waiters of ours not in Redis's line (``riders``)."""
    token, fence, pttl_ms, waiting = text(reply[0]), reply[1], reply[2], int(reply[3])
    if not token:
        return LockState(resource, (), waiting + riding)
    holder = Holder(int(fence), max(int(pttl_ms), 0) / 1000, owner_of(token))
    return LockState(resource, (holder,), waiting + riding)


def one_slot(resources: Sequence[str], sharded: bool) -> bool:
    """Whether one script may touch every lock of ``resources``: always on one server;
    on a Cluster (``sharded``), when their keys share a hash slot."""
    if not sharded:
        return True
    return len({key_slot(lock_keys(r, True).owner.encode()) for r in resources}) == 1


def acquire_many_call(
    resources: Sequence[str], tokens: Sequence[str], ttl_ms: int, sharded: bool = False
) -> tuple[list[str], list[Any]]:
    """Keys and arguments of one ``lock/acquire_many`` call (``tokens``: one per resource)."""
    keys: list[str] = []
    args: list[Any] = [ttl_ms]
    for resource, token in zip(resources, tokens, strict=True):
        k = lock_keys(resource, sharded)
        keys += k.acquire
        args += [token, k.channel]
    return keys, args


def release_many_call(
    leases: Sequence[tuple[str, str, Sequence[str]]],
    node: str,
    retried: bool = True,
    sharded: bool = False,
) -> tuple[list[str], list[Any]]:
    """Keys and arguments of one ``lock/release_many`` call: ``leases`` as (resource,
    token, riders) triples; ``node`` and ``retried`` as for ``release_call``."""
    keys: list[str] = []
    args: list[Any] = [node, PLACE_MS]
    for resource, token, riders in leases:
        k = lock_keys(resource, sharded)
        keys += k.release
        call = secrets.token_hex(8) if retried else ""
        args += [token, k.channel, call, len(riders), *riders]
    return keys, args


def text(value: Any) -> str:
    """A reply or pub/sub field as ``str`` (clients may return bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)
