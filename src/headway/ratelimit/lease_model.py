"""Leased quota, the reference model: what ``lua/ratelimit/lease.lua`` does, in Python.

A lease charges ``k`` units of a key's quota at once, through each algorithm's
own model, and says for how long each unit may be spent (see ``docs/decisions.md``,
"Leased quota"). Per algorithm it adds three things to the model:

- ``(off, step)``: unit ``i`` of a lease (0-based, the request that took it first)
  may be spent until ``charged at + off + i * step`` microseconds. Windows (fixed
  window, sliding counter): until the window the units were charged to ends (``step``
  0). Buckets (token, leaky): unit ``i`` holds the ``i``-th refill slot the charge
  reserved, and may be spent only until that slot starts, so the bucket never refills
  behind a unit still unspent; the slots start at least ``hold`` after the charge
  (``bucket_charge``: the refill of that gap is held back) while the bucket has room.
- ``mark``: what the state must still say for units to be given back (the window
  index; the bucket's end, its theoretical arrival time).
- ``give_back``: the state with ``units`` unspent units taken off, or None when the
  state moved on (a later window; another charge since, for a bucket).

The sliding log is not leased: see ``check_leasable``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headway.ratelimit.model import AlgorithmResult, ModelCheck

__all__ = ["BUCKETS", "LEASED_KINDS", "bucket_charge", "give_back", "grant", "lease", "terms"]

#: The algorithm kinds (``algorithms.ALGORITHMS``) a lease can take quota from exactly.
LEASED_KINDS = frozenset({1, 2, 3, 5})
#: The buckets among them (token, leaky): their leases reserve refill slots.
BUCKETS = frozenset({1, 2})


def bucket_charge(
    kind: int, state: Any, now: int, k: int, a: int, b: int, gap: int
) -> tuple[Any, int, int, int, int]:
    """A bucket charged ``k`` units, its first slot at least ``gap`` us away.

    Returns ``(state, ttl_us, remaining_after, reset_after, off)``: the bucket's end
    (its TAT) moves to ``max(end, now + gap) + k * a``, and ``off`` is where the lease's
    slots start, so that its units stay valid for ``gap`` at least.
    """
    if kind == 1:
        end = now if state is None else max(state, now)
    else:
        level, stamp = state if state is not None else (0, now)
        end = now + max(0, level - max(0, now - stamp))
    start = max(end, now + gap)
    new_end = start + k * a
    written = new_end if kind == 1 else (new_end - now, now)
    remaining = (a * b - (new_end - now)) // a
    return written, new_end - now, remaining, new_end - now, start - now


def terms(kind: int, after: AlgorithmResult, now: int, a: int) -> tuple[int, int, int]:
    """``(off, step, mark)`` of a window's lease charged at ``now``: its last us."""
    index = now // a
    return (index + 1) * a - now - 1, 0, index


def give_back(kind: int, state: Any, mark: int, units: int, a: int) -> Any:
    """``state`` with ``units`` given back to it, or None if ``mark`` no longer matches."""
    if state is None:
        return None
    if kind == 1:
        return state - units * a if state == mark else None
    if kind == 2:
        level, stamp = state
        return (level - units * a, stamp) if level + stamp == mark else None
    if kind == 3:
        return (state[0], max(0, state[1] - units)) if state[0] == mark else None
    if state[0] == mark + 1:  # a sliding counter's previous window still weighs: lighten it
        return (state[0], state[1], max(0, state[2] - units))
    return (state[0], max(0, state[1] - units), state[2]) if state[0] == mark else None


def grant(least: int, cost: int, want: int, permille: int) -> int:
    """Units a lease takes: ``permille``/1000 of the least remaining, within [cost, want]."""
    return min(least, max(cost, min(want, least * permille // 1000)))


def lease(
    states: Sequence[Any],
    checks: Sequence[tuple[ModelCheck, int, int]],
    kinds: Sequence[int],
    now: int,
    cost: int,
    want: int,
    permille: int,
    hold_us: int,
) -> tuple[list[int], list[tuple[Any, int]] | None]:
    """Lease for a request of ``cost``: the script's reply, and the states to write.

    Reply: ``[granted, then per policy: ok, remaining, reset_us, retry_us, off, step,
    mark]``; ``granted`` 0 is a refusal (then the fields are ``check``'s at ``cost``,
    and off, step, mark are 0); else the fields are after charging ``granted``.
    """
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
    for state, (check, a, b), kind, r in zip(states, checks, kinds, before, strict=True):
        if kind in BUCKETS:
            gap = min(hold_us, (r.remaining - k) * a)
            written, _, left, reset, off = bucket_charge(kind, state, now, k, a, b, gap)
            mark = written if kind == 1 else written[0] + written[1]
            reply += (1, left, reset, 0, off, a, mark)
            # The key lasts as long as a bucket's state can matter (lease.lua: a refill
            # from empty, kept while the key's TTL covers the new state).
            writes.append((written, a * b))
        else:
            after = check(state, now, k, a, b)
            reply += (1, after.remaining_after, after.reset_after, 0, *terms(kind, after, now, a))
            writes.append((after.state, after.ttl_us))
    return reply, writes
