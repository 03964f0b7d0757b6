"""Concurrency slots on Redis, for both Redis backends: a semaphore's permits.

A ``Concurrency`` policy's slots are the permits of a semaphore of ``policy.limit``
(``lua/lock/modes/``) whose resources are the limiter's keys and whose holders' keys
``slots.slot_key`` names. ``SlotCalls`` keeps each policy's calls (``ModeCalls``);
``grant`` reads the answer-at-once ``lock/modes/try``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from headway.lock.backends.redis.mode_keys import ModeCalls
from headway.lock.modes import permits
from headway.ratelimit.policies import Concurrency
from headway.ratelimit.slots import Grant, slot_key

__all__ = ["SlotCalls", "grant", "slot_calls", "slot_key_of"]


def grant(reply: int | Sequence[Any]) -> Grant:
    """``lock/modes/try.lua``'s reply: the slots held when granted, else those and the
    µs to wait."""
    if isinstance(reply, int):
        return Grant(True, reply, 0)
    return Grant(False, int(reply[0]), int(reply[1]))


def slot_calls(policy: Concurrency, sharded: bool) -> ModeCalls:
    """The calls of ``policy``'s slots: a semaphore of ``policy.limit`` permits whose
    resources are the limiter's keys, its holders keys named by ``slots.slot_key``."""
    return ModeCalls(permits(policy.limit), sharded, functools.partial(slot_key_of, policy))


def slot_key_of(policy: Concurrency, key: str) -> str:
    """The key of ``policy``'s slots for the limiter's ``key`` (arguments in partial order)."""
    return slot_key(key, policy)


class SlotCalls:
    """One backend's ``ModeCalls`` by ``Concurrency`` policy, made when first asked for.

    Args:
        sharded: Whether the client is a Cluster's (``ModeCalls``' ``sharded``).
    """

    def __init__(self, sharded: bool) -> None:
        self.sharded = sharded
        self._by_policy: dict[Concurrency, ModeCalls] = {}
        self._recent: tuple[Concurrency, ModeCalls] | None = None

    def of(self, policy: Concurrency) -> ModeCalls:
        """``policy``'s calls (kept for the next call with it)."""
        recent = self._recent
        if recent is not None and recent[0] is policy:
            return recent[1]  # one limiter per backend: found without hashing its policy
        calls = self._by_policy.get(policy)
        if calls is None:
            if len(self._by_policy) >= 256:  # policies made per request: start afresh
                self._by_policy.clear()
            calls = self._by_policy[policy] = slot_calls(policy, self.sharded)
        self._recent = (policy, calls)
        return calls
