"""Leased quota: a limiter takes units from the backend in chunks and decides in process.

``Leasing`` is the option (``RateLimiter(..., lease=Leasing())``). ``Ledger`` keeps
one limiter's leases, one per key: a decision spends from the key's lease when it
can (no I/O), and otherwise calls the backend's ``lease``, which charges up to
``chunk`` units (fewer as the quota runs out: at most ``share`` of what remains,
never less than the request's cost) and says until when each unit may be spent
(``lease_model``). Unspent units go back with the key's next lease call, when the
lease is held ``hold`` seconds, or on ``RateLimiter.return_leases``. A forked child
starts with no leases: units leased by its parent are never spent twice.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.decision import Decision, admitted, decision_from_reply
from headway.ratelimit.policies import MAX_UNITS

__all__ = ["Held", "Leasing", "Ledger", "check_leasable"]

# Every ledger of this process: a forked child empties its copies (the parent's leases).
_LEDGERS: weakref.WeakSet[Ledger] = weakref.WeakSet()


def _forked() -> None:
    for ledger in list(_LEDGERS):
        ledger.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


@dataclass(frozen=True, slots=True)
class Leasing:
    """Take quota from the backend in chunks, decide in process (exact: see docs/ratelimit.md).

    Args:
        chunk: The most units one lease takes, 1 to 10**9; default 128.
        share: The most of a key's remaining quota one lease takes, 0.001 to 1
            (kept in thousandths); default 0.125. Near the end each decision is one
            call again, and one process cannot sit on the last units.
        hold: Seconds after which a lease's unspent units go back, 0.001 to 60;
            default 0.1 (a bucket's units expire sooner, as it refills).

    Raises:
        TypeError: ``chunk`` is not an int.
        ValueError: A parameter out of range.
    """

    chunk: int = 128
    share: float = 0.125
    hold: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int):
            raise TypeError(f"Leasing.chunk must be an int, not {type(self.chunk).__name__}")
        if not 1 <= self.chunk <= MAX_UNITS:
            raise ValueError(f"Leasing.chunk must be between 1 and {MAX_UNITS}, got {self.chunk}")
        if not (isinstance(self.share, int | float) and 0.001 <= self.share <= 1):
            raise ValueError(f"Leasing.share must be between 0.001 and 1, got {self.share!r}")
        hold = self.hold
        if not (isinstance(hold, int | float) and math.isfinite(hold) and 0.001 <= hold <= 60):
            raise ValueError(f"Leasing.hold must be between 0.001 and 60 seconds, got {hold!r}")

    @property
    def hold_us(self) -> int:
        """``hold`` in whole microseconds."""
        return round(self.hold * 1_000_000)

    @property
    def permille(self) -> int:
        """``share`` in thousandths, as the scripts receive it."""
        return max(1, round(self.share * 1000))


def check_leasable(policies: PolicySet) -> None:
    """Raise ValueError for a policy whose algorithm declares it cannot be leased exactly."""
    for algorithm in policies.algorithms:
        algorithm.leased()


class Held:
    """One lease on one key: what it granted, what was spent, until when units last."""

    __slots__ = ("base", "ends", "marks", "parts", "reset_at", "terms", "top", "units", "used")

    def __init__(self, reply: list[int], n: int, base: int, cost: int, hold_us: int) -> None:
        self.base = base  # local us when the call was sent: no later than the server's charge
        self.units = reply[0]
        self.used = cost  # the request that took the lease spent its cost
        fields = [reply[1 + 7 * i : 8 + 7 * i] for i in range(n)]
        self.parts = [(f[1], f[2]) for f in fields]  # (remaining, reset_us) after the charge
        self.marks = [f[6] for f in fields]
        # A window's units all end with it: one deadline with the hold's. A bucket's unit
        # i ends at start + i * step, each later than the one before.
        self.ends = min([base + hold_us] + [base + f[4] for f in fields if f[5] == 0])
        self.terms = [(base + f[4], f[5]) for f in fields if f[5] != 0]
        # One policy's numbers, ready: remaining = top - used, reset after reset_at - now.
        self.top = self.parts[0][0] + self.units
        self.reset_at = base + self.parts[0][1]

    @property
    def unspent(self) -> int:
        """Units granted and not spent."""
        return self.units - self.used


class Ledger:
    """One limiter's leases, by key (used from one event loop, or by threads holding ``lock``)."""

    def __init__(self, leasing: Leasing, policies: PolicySet) -> None:
        check_leasable(policies)
        self.leasing = leasing
        self.policies = policies
        self.hold_us = leasing.hold_us
        self.held: dict[str, Held] = {}
        self.pending: dict[str, asyncio.Future[None]] = {}  # lease calls in flight, by key
        self.single = policies[0] if len(policies) == 1 else None
        self.lock = threading.Lock()  # the sync limiter's threads: see ``sync_leasing``
        _LEDGERS.add(self)

    def forget(self) -> None:
        """Drop every lease without giving it back (a forked child's copies of its parent's)."""
        self.held = {}
        self.pending = {}
        self.lock = threading.Lock()  # a thread of the parent may have held it at the fork

    def spend(self, key: str, now: int, cost: int, peek: bool) -> Decision | None:
        """The decision from ``key``'s lease if it covers ``cost`` at ``now`` (us), else None."""
        held = self.held.get(key)
        if held is None:
            return None
        # Covered if the units are there and the first to spend has not ended (units are
        # spent in order; a bucket's end later one after another).
        index = held.used
        used = index + cost
        if used > held.units or now > held.ends:
            return None
        if held.terms:
            for start, step in held.terms:
                if now > start + index * step:
                    return None
        if peek:
            used = index  # a peek reports what remains before it, as decide
        else:
            held.used = used
        if self.single is not None:  # the common case: one policy, no reply to build
            reset = held.reset_at - now
            return admitted(self.single, held.top - used, reset / 1e6 if reset > 0 else 0.0)
        left = held.units - used
        elapsed = now - held.base
        many = [1]
        for remaining, reset in held.parts:
            many += (1, remaining + left, max(0, reset - elapsed), 0)
        return decision_from_reply(many, self.policies)

    def take(self, key: str) -> Held | None:
        """Remove ``key``'s lease (to return its unspent units), if it has any."""
        held = self.held.pop(key, None)
        return held if held is not None and held.unspent > 0 else None

    def install(self, key: str, reply: list[int], sent: int, cost: int) -> Held | None:
        """Keep the lease in ``reply`` for ``key``; returns a lease it replaced, to give back."""
        held = Held(reply, len(self.policies), sent, cost, self.hold_us)
        current = self.held
        old = current.get(key)
        current[key] = held
        return old if old is not None and old.unspent > 0 else None

    def decision(self, reply: list[int], cost: int) -> Decision:
        """The decision for the request that made the lease call."""
        n = len(self.policies)
        out = [1 if reply[0] else 0]
        extra = reply[0] - cost if reply[0] else 0
        for i in range(n):
            ok, remaining, reset, retry = reply[1 + 7 * i : 5 + 7 * i]
            out += (ok, remaining + extra, reset, retry)
        return decision_from_reply(out, self.policies)

    def expired(self, key: str, held: Held) -> Held | None:
        """When ``held``'s hold time is up: remove it, and return it if units are left."""
        if self.held.get(key) is not held:
            return None
        return self.take(key)

    def everything(self) -> list[tuple[str, Held]]:
        """Remove every lease that has unspent units."""
        current = self.held
        items = [(k, h) for k, h in current.items() if h.unspent > 0]
        current.clear()
        return items


def back_of(held: Held | None) -> tuple[int, list[Any]]:
    """``(units, marks)`` to give back for ``held`` (nothing for None)."""
    if held is None:
        return 0, []
    return held.unspent, held.marks
