"""Leased quota, the reference model: what ``lua/ratelimit/lease.lua`` does, in Python.

A lease charges ``k`` units of a key's quota at once, through each algorithm's
own model, and says for how long each unit may be spent (see ``docs/decisions/ratelimit.md``,
"Leased quota"). Each algorithm declares in its ``algorithms.ALGORITHMS`` entry
whether and how it is leased, with one of the values below, which add to its model:

- ``(off, step)``: unit ``i`` of a lease (0-based, the request that took it first)
  may be spent until ``charged at + off + i * step`` microseconds. A ``WindowLease``
  (fixed window, sliding counter): until the window the units were charged to ends
  (``step`` 0). A ``BucketLease`` (token, leaky): unit ``i`` holds the ``i``-th refill
  slot the charge reserved, and may be spent only until that slot starts, so the
  bucket never refills behind a unit still unspent; the slots start at least ``hold``
  after the charge (``bucket_charge``: the refill of that gap is held back) while the
  bucket has room.
- ``mark``: what the state must still say for units to be given back (the window
  index; the bucket's end, its theoretical arrival time).
- ``give_back``: the state with ``units`` unspent units taken off, or None when the
  state moved on (a later window; another charge since, for a bucket).

``NotLeased`` says why an algorithm cannot be leased exactly (the sliding log).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from headway.ratelimit.model import AlgorithmResult, ModelCheck

__all__ = [
    "BucketLease",
    "NotLeased",
    "QuotaLeaseModel",
    "WindowLease",
    "bucket_charge",
    "fixed_window",
    "give_back",
    "grant",
    "leaky_bucket",
    "lease",
    "sliding_counter",
    "token_bucket",
    "window_terms",
]

#: ``give_back(state, mark, units, a)``: ``state`` (never None) with ``units`` given
#: back, or None when ``mark`` no longer matches it.
GiveBack = Callable[[Any, int, int, int], Any]


@dataclass(frozen=True, slots=True)
class WindowLease:
    """Leased as a window: the algorithm's own model charges the ``k`` units, which
    last until the window they were charged to ends.

    ``fragment`` (under ``lua/``) registers ``leasing[kind]`` with ``terms`` and
    ``give_back``; ``give_back`` is the latter's model.
    """

    fragment: str
    give_back: GiveBack


@dataclass(frozen=True, slots=True)
class BucketLease:
    """Leased as a bucket: a lease reserves refill slots (``bucket_charge``).

    ``end(state, now)`` is the bucket's end (its theoretical arrival time) in
    ``state``, ``state(end, now)`` the state written for an end. ``fragment``
    registers ``leasing[kind]`` with ``charge`` and ``give_back``.
    """

    fragment: str
    give_back: GiveBack
    end: Callable[[Any, int], int]
    state: Callable[[int, int], Any]


@dataclass(frozen=True, slots=True)
class NotLeased:
    """Not leased: ``reason`` is why a lease could not stay exact (a limiter says it)."""

    reason: str


#: How an algorithm's quota is leased (a quota lease), or why not: what its entry in
#: ``algorithms.ALGORITHMS`` must declare. Not the lock's ``headway.Lease``.
QuotaLeaseModel = WindowLease | BucketLease | NotLeased


# Fixed window: state (window index, count); the mark is the window index.
def _window_give_back(state: Any, mark: int, units: int, a: int) -> Any:
    return (state[0], max(0, state[1] - units)) if state[0] == mark else None


# Sliding counter: state (window index, count, previous count); the mark, the window's index.
def _counter_give_back(state: Any, mark: int, units: int, a: int) -> Any:
    if state[0] == mark + 1:  # a sliding counter's previous window still weighs: lighten it
        return (state[0], state[1], max(0, state[2] - units))
    return (state[0], max(0, state[1] - units), state[2]) if state[0] == mark else None


# Token bucket: the state is its end, the TAT (the mark too).
def _tat_end(state: Any, now: int) -> int:
    return now if state is None else max(state, now)


def _tat_give_back(state: Any, mark: int, units: int, a: int) -> Any:
    return state - units * a if state == mark else None


# Leaky bucket: state (level, stamp); its end, the mark, is stamp + level.
def _level_end(state: Any, now: int) -> int:
    level, stamp = state if state is not None else (0, now)
    return now + max(0, level - max(0, now - stamp))


def _level_give_back(state: Any, mark: int, units: int, a: int) -> Any:
    level, stamp = state
    return (level - units * a, stamp) if level + stamp == mark else None


token_bucket = BucketLease(
    "ratelimit/leasing/token_bucket", _tat_give_back, _tat_end, lambda end, now: end
)
leaky_bucket = BucketLease(
    "ratelimit/leasing/leaky_bucket",
    _level_give_back,
    _level_end,
    lambda end, now: (end - now, now),
)
fixed_window = WindowLease("ratelimit/leasing/fixed_window", _window_give_back)
sliding_counter = WindowLease("ratelimit/leasing/sliding_counter", _counter_give_back)


def bucket_charge(
    how: BucketLease, state: Any, now: int, k: int, a: int, b: int, gap: int
) -> tuple[Any, int, int, int, int, int]:
    """A bucket charged ``k`` units, its first slot at least ``gap`` us away.

    Returns ``(state, ttl_us, remaining_after, reset_after, off, mark)``: the bucket's
    end moves to ``max(end, now + gap) + k * a`` (the mark), and ``off`` is where the
    lease's slots start, so that its units stay valid for ``gap`` at least.
    """
    start = max(how.end(state, now), now + gap)
    new_end = start + k * a
    remaining = (a * b - (new_end - now)) // a
    return how.state(new_end, now), new_end - now, remaining, new_end - now, start - now, new_end


def window_terms(now: int, a: int) -> tuple[int, int, int]:
    """``(off, step, mark)`` of a window's lease charged at ``now``: its last us."""
    index = now // a
    return (index + 1) * a - now - 1, 0, index


def give_back(how: QuotaLeaseModel, state: Any, mark: int, units: int, a: int) -> Any:
    """``state`` with ``units`` given back to it, or None if ``mark`` no longer matches."""
    if state is None or isinstance(how, NotLeased):
        return None
    return how.give_back(state, mark, units, a)


def grant(least: int, cost: int, want: int, permille: int) -> int:
    """Units a lease takes: ``permille``/1000 of the least remaining, within [cost, want]."""
    return min(least, max(cost, min(want, least * permille // 1000)))


def lease(
    states: Sequence[Any],
    checks: Sequence[tuple[ModelCheck, int, int]],
    leases: Sequence[QuotaLeaseModel],
    now: int,
    cost: int,
    want: int,
    permille: int,
    hold_us: int,
) -> tuple[list[int], list[tuple[Any, int]] | None]:
    """Lease for a request of ``cost``: the script's reply, and the states to write.

    ``leases`` holds each policy's declaration (``PolicySet.leases``). Reply:
    ``[granted, then per policy: ok, remaining, reset_us, retry_us, off, step, mark]``;
    ``granted`` 0 is a refusal (then the fields are ``check``'s at ``cost``, and off,
    step, mark are 0); else the fields are after charging ``granted``.
    """
    for how in leases:
        if isinstance(how, NotLeased):
            raise ValueError(f"cannot be leased: {how.reason}")  # noqa: TRY004 (as check_leasable)
    before = [
        check(state, now, cost, a, b) for state, (check, a, b) in zip(states, checks, strict=True)
    ]
    if not all(r.ok for r in before):
        reply = [0]
        for r in before:
            reply += (1 if r.ok else 0, r.remaining, r.reset, r.retry, 0, 0, 0)
        return reply, None
    k = grant(min(r.remaining for r in before), cost, want, permille)
    reply = [k]
    writes = []
    for state, (check, a, b), how, r in zip(states, checks, leases, before, strict=True):
        if isinstance(how, BucketLease):
            gap = min(hold_us, (r.remaining - k) * a)
            written, _, left, reset, off, mark = bucket_charge(how, state, now, k, a, b, gap)
            reply += (1, left, reset, 0, off, a, mark)
            # The key lasts as long as a bucket's state can matter (lease.lua: a refill
            # from empty, kept while the key's TTL covers the new state).
            writes.append((written, a * b))
        else:
            after: AlgorithmResult = check(state, now, k, a, b)
            reply += (1, after.remaining_after, after.reset_after, 0, *window_terms(now, a))
            writes.append((after.state, after.ttl_us))
    return reply, writes
