"""The keys and scripts of Redis read-write locks and semaphores, and their calls.

One family (``LockMode.family``: "rw" or "permits") on one resource is one set of
keys named after its holders key ``H``: ``H``, ``H:held``, ``H:queue``, ... (the
layout is ``lua/lock/modes/queue.lua``'s). A lock's ``H`` is its hash tag alone,
``headway:{lock-<family>:<resource>}``: one slot on a Cluster, apart from the exclusive
lock's (``{lock:<resource>}``) and from the other family's. A concurrency limit's
slots are permits of the same layout whose ``H`` is ``ratelimit.slots.slot_key``
(``headway:{rl:<key>}:cc<limit>``, the tag of the key's rate-limit state). The
scripts (``lua/lock/modes/``) implement ``lock.modes``' rule; ``MODE_TRY`` is its
answer-at-once call (no queue, no fence), the limiter's acquire.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from headway._keys import tag_base
from headway._redis.scripts import Script
from headway.lock.backends.redis.keys import text
from headway.lock.flow import Try
from headway.lock.introspection import Holder, HolderMode, LockState, owner_of
from headway.lock.modes import WHOLE, LockMode

__all__ = [
    "MODE_ACQUIRE",
    "MODE_EXTEND",
    "MODE_INSPECT",
    "MODE_LEAVE",
    "MODE_RELEASE",
    "MODE_TRY",
    "ModeCalls",
    "family_keys",
    "handed",
    "holders_key",
    "mode_keys",
    "mode_state",
    "released",
]

_QUEUE = ("clock", "lock/handoff", "lock/modes/queue")
MODE_ACQUIRE = Script("lock/modes/acquire", include=_QUEUE)
# Giving a lease back (or keeping it) must work on a Redis out of memory: ``allow_oom``.
MODE_RELEASE = Script("lock/modes/release", include=_QUEUE, allow_oom=True)
MODE_EXTEND = Script("lock/modes/extend", include=_QUEUE, allow_oom=True)
MODE_LEAVE = Script("lock/modes/leave", include=_QUEUE, allow_oom=True)
MODE_TRY = Script("lock/modes/try", include=_QUEUE)
MODE_INSPECT = Script("lock/modes/inspect", include=("clock",))


@dataclass(frozen=True, slots=True)
class ModeKeys:
    """One family's keys on one resource (in the scripts' order) and its wake-up channel."""

    keys: tuple[str, ...]
    channel: str


_QUEUE_PART = ":queue"
_PARTS = (":held", _QUEUE_PART, ":places", ":wants", ":fence", ":released")


@functools.lru_cache(maxsize=4096)
def family_keys(holders: str, sharded: bool = False) -> ModeKeys:
    """The keys of the family whose holders key is ``holders``; ``sharded``: a sharded
    channel (Cluster). Every name extends ``holders``, so they share its hash tag."""
    keys = (holders, *(holders + part for part in _PARTS))
    return ModeKeys(keys, holders + (":swake" if sharded else ":wake"))


def holders_key(family: str, resource: str) -> str:
    """A lock's holders key: the hash tag of ``family`` on ``resource``, alone."""
    return tag_base(f"lock-{family}", resource)[:-1]


@functools.lru_cache(maxsize=4096)
def mode_keys(family: str, resource: str, sharded: bool = False) -> ModeKeys:
    """The keys of ``family`` on ``resource``; ``sharded``: a sharded channel (Cluster)."""
    return family_keys(holders_key(family, resource), sharded)


class ModeCalls:
    """Builds the scripts' calls for one mode (keys, then arguments).

    ``holders`` names a resource's holders key (by default a lock's, ``holders_key``);
    the concurrency limiter's names its slots' (``ratelimit.slots.slot_key``).
    """

    def __init__(
        self, mode: LockMode, sharded: bool, holders: Callable[[str], str] | None = None
    ) -> None:
        self.family = mode.family
        self.weight = mode.weight
        self.capacity = mode.capacity
        self.sharded = sharded
        self._holders = holders

    def keys(self, resource: str) -> ModeKeys:
        """The keys of this mode's family on ``resource``."""
        if self._holders is None:
            return mode_keys(self.family, resource, self.sharded)
        return family_keys(self._holders(resource), self.sharded)

    def short_keys(self, resource: str) -> tuple[str, str]:
        """The keys of a short call (``take``'s, and a release or renewal of what it
        took): the holders and the queue."""
        if self._holders is None:
            holders = holders_key(self.family, resource)
        else:
            holders = self._holders(resource)
        return holders, holders + _QUEUE_PART

    def take(self, resource: str, token: str, ttl_ms: int) -> tuple[tuple[str, str], list[Any]]:
        """``lock/modes/try`` (a semaphore's): a permit at once or not at all, unfenced."""
        return self.short_keys(resource), [token, ttl_ms, self.capacity]

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
        return k.keys, [token, call, k.channel, node, self.capacity]

    def short_release(self, resource: str, token: str) -> tuple[tuple[str, str], list[Any]]:
        """``lock/modes/release``'s short call, for a lease ``take`` granted (two keys; from
        a client that never retries): answered -1 while somebody waits, then send
        ``release``."""
        return self.short_keys(resource), [token]

    def extend(self, resource: str, token: str, ttl_ms: int) -> tuple[tuple[str, ...], list[Any]]:
        """``lock/modes/extend``."""
        k = self.keys(resource)
        return k.keys, [token, ttl_ms, k.channel, self.capacity]

    def short_extend(
        self, resource: str, token: str, ttl_ms: int
    ) -> tuple[tuple[str, str], list[Any]]:
        """``lock/modes/extend``'s short call, for a lease ``take`` granted (two keys):
        answered -1 while somebody waits, then send ``extend``."""
        return self.short_keys(resource), [token, ttl_ms]

    def inspect(self, resource: str) -> tuple[tuple[str, ...], list[Any]]:
        """``lock/modes/inspect``: the holders, held and places keys, no arguments."""
        keys = self.keys(resource).keys
        return (keys[0], keys[1], keys[3]), []

    def leave(self, resource: str, waiter: str) -> tuple[tuple[str, ...], list[Any]]:
        """``lock/modes/leave``."""
        k = self.keys(resource)
        return k.keys, [waiter, k.channel, self.capacity]


def mode_state(resource: str, family: str, reply: Any) -> LockState:
    """The ``LockState`` a ``lock/modes/inspect`` reply tells, oldest fence first."""
    holders = []
    for i in range(1, len(reply) - 2, 3):
        token, left_us, held = text(reply[i]), int(reply[i + 1]), text(reply[i + 2])
        weight, _, fence = held.partition(":") if held else ("1", "", "0")
        kind: HolderMode = "permits"
        if family == "rw":
            kind = "write" if int(weight) == WHOLE else "read"
        holders.append(Holder(int(fence), left_us / 1e6, owner_of(token), kind))
    holders.sort(key=lambda holder: holder.fence)
    return LockState(resource, tuple(holders), int(reply[0]))


def released(reply: Any) -> int:
    """What a ``lock/modes/release`` answered: 1 released, 0 not held, -1 send it whole."""
    return int(reply[0] if isinstance(reply, list) else reply)


def handed(reply: Any) -> Sequence[tuple[str, int]]:
    """The waiters (of the releasing client) and fences a ``lock/modes/release`` granted."""
    rest = reply[1:] if isinstance(reply, list) else ()
    return [(text(rest[i]), int(rest[i + 1])) for i in range(0, len(rest) - 1, 2)]
