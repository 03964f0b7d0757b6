"""The Redis lock's keys and scripts, and the pure helpers that build their calls.

Every key of one lock shares a hash tag (``headway:{lock:<resource>}:...``),
so the scripts run on Redis Cluster too. Redlock runs the same scripts on
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

from headway._keys import tagged
from headway._redis.scripts import Script
from headway.lock.flow import PLACE_MS, Try
from headway.lock.introspection import Holder, LockState, owner_of

__all__ = [
    "ACQUIRE",
    "EXTEND",
    "FENCE_RAISE",
    "INSPECT",
    "LEAVE",
    "RELEASE",
    "acquire_call",
    "handed_to",
    "inspect_call",
    "leave_call",
    "lock_keys",
    "lock_state",
    "release_call",
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
    owner, fence, queue, places, released, channel = tagged("lock", resource, *parts)
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


def handed_to(reply: Any) -> tuple[str, int] | None:
    """The waiter and fence a ``lock/release`` reply handed the lock to, if any."""
    if isinstance(reply, list):  # {1, waiter, fence}; a plain 1 or 0 otherwise
        return text(reply[1]), int(reply[2])
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


def text(value: Any) -> str:
    """A reply or pub/sub field as ``str`` (clients may return bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)
