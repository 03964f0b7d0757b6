"""The keys and scripts of Redis read-write locks and semaphores, and their calls.

One family (``LockMode.family``: "rw" or "permits") on one resource is one set of
keys under one hash tag, ``headway:{lock-<family>:<resource>}:...``: one slot on a
Cluster, and apart from the exclusive lock's (``{lock:<resource>}``) and from the
other family's. The scripts (``lua/lock/modes/``) implement ``lock.modes``' rule.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from headway._keys import tagged
from headway._redis.scripts import Script
from headway.lock.backends.redis.keys import text
from headway.lock.flow import Try
from headway.lock.modes import LockMode

__all__ = [
    "MODE_ACQUIRE",
    "MODE_EXTEND",
    "MODE_LEAVE",
    "MODE_RELEASE",
    "ModeCalls",
    "handed",
]

_QUEUE = ("clock", "lock/handoff", "lock/modes/queue")
MODE_ACQUIRE = Script("lock/modes/acquire", include=_QUEUE)
# Giving a lease back (or keeping it) must work on a Redis out of memory: ``allow_oom``.
MODE_RELEASE = Script("lock/modes/release", include=_QUEUE, allow_oom=True)
MODE_EXTEND = Script("lock/modes/extend", include=_QUEUE, allow_oom=True)
MODE_LEAVE = Script("lock/modes/leave", include=_QUEUE, allow_oom=True)


@dataclass(frozen=True, slots=True)
class ModeKeys:
    """One family's keys on one resource (in the scripts' order) and its wake-up channel."""

    keys: tuple[str, ...]
    channel: str


@functools.lru_cache(maxsize=4096)
def mode_keys(family: str, resource: str, sharded: bool = False) -> ModeKeys:
    """The keys of ``family`` on ``resource``; ``sharded``: a sharded channel (Cluster)."""
    parts = ("held", "expiries", "queue", "places", "wants", "fence", "released")
    *keys, channel = tagged(f"lock-{family}", resource, *parts, "swake" if sharded else "wake")
    return ModeKeys(tuple(keys), channel)


class ModeCalls:
    """Builds the scripts' calls for one mode (keys, then arguments)."""

    def __init__(self, mode: LockMode, sharded: bool) -> None:
        self.family = mode.family
        self.weight = mode.weight
        self.capacity = mode.capacity
        self.sharded = sharded

    def keys(self, resource: str) -> ModeKeys:
        """The keys of this mode's family on ``resource``."""
        return mode_keys(self.family, resource, self.sharded)

    def acquire(self, resource: str, step: Try) -> tuple[tuple[str, ...], list[Any]]:
        """``lock/modes/acquire`` for one attempt."""
        k = self.keys(resource)
        args = [step.token, step.ttl_ms, step.waiter, step.place_ms, self.weight]
        return k.keys, [*args, self.capacity, k.channel]

    def release(
        self, resource: str, token: str, node: str, retried: bool
    ) -> tuple[tuple[str, ...], list[Any]]:
        """``lock/modes/release``; a ``retried`` call (redis-py) gets an id to be recognised by."""
        k = self.keys(resource)
        call = secrets.token_hex(8) if retried else ""
        return k.keys, [token, k.channel, call, node, self.capacity]

    def extend(self, resource: str, token: str, ttl_ms: int) -> tuple[tuple[str, ...], list[Any]]:
        """``lock/modes/extend``."""
        k = self.keys(resource)
        return k.keys, [token, ttl_ms, k.channel, self.capacity]

    def leave(self, resource: str, waiter: str) -> tuple[tuple[str, ...], list[Any]]:
        """``lock/modes/leave``."""
        k = self.keys(resource)
        return k.keys, [waiter, k.channel, self.capacity]


def handed(reply: Any) -> Sequence[tuple[str, int]]:
    """The waiters (of the releasing client) and fences a ``lock/modes/release`` granted."""
    rest = reply[1:] if isinstance(reply, list) else ()
    return [(text(rest[i]), int(rest[i + 1])) for i in range(0, len(rest) - 1, 2)]
