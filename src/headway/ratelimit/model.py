"""The reference model: every algorithm in pure Python, mirroring the Lua fragments.

Each algorithm's function takes a policy's stored state, the time (integer
microseconds), the cost and the policy's two integer parameters, and returns
what its fragment's ``check`` finds, plus the state and TTL a charge would write.
``decide`` combines several policies all-or-nothing and replies what
``ratelimit/decide.lua`` replies. The in-memory backend runs this model; the
differential tests hold the scripts to it, decision for decision.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AlgorithmResult",
    "ModelCheck",
    "decide",
    "fixed_window",
    "leaky_bucket",
    "sliding_counter",
    "sliding_log",
    "token_bucket",
]


@dataclass(frozen=True, slots=True)
class AlgorithmResult:
    """What one algorithm found for one policy: the answer before and after a charge."""

    ok: bool
    remaining: int
    remaining_after: int
    reset: int
    reset_after: int
    retry: int
    state: Any  # written on charge
    ttl_us: int  # the TTL its key gets: at least as long as the written state matters


def token_bucket(state: int | None, now: int, cost: int, a: int, b: int) -> AlgorithmResult:
    """Token bucket as GCRA; the state is the theoretical arrival time."""
    tau = a * b
    tat = max(now if state is None else state, now)
    new_tat = tat + cost * a
    ok = new_tat - now <= tau
    # In debt (a settled reservation charged past the limit) nothing remains.
    remaining = max(0, tau - (tat - now)) // a
    after = (tau - (new_tat - now)) // a if ok else remaining
    retry = 0 if ok else new_tat - tau - now
    # The key lives as long as any state can matter (a refill from empty): a Redis key
    # keeps that TTL while it covers the state, and a key that outlives it reads as full.
    return AlgorithmResult(ok, remaining, after, tat - now, new_tat - now, retry, new_tat, tau)


def leaky_bucket(
    state: tuple[int, int] | None, now: int, cost: int, a: int, b: int
) -> AlgorithmResult:
    """Leaky bucket as a meter; the state is (level, when measured)."""
    full = a * b
    level, stamp = state if state is not None else (0, now)
    level = max(0, level - max(0, now - stamp))
    new_level = level + cost * a
    ok = new_level <= full
    remaining = max(0, full - level) // a
    after = (full - new_level) // a if ok else remaining
    retry = 0 if ok else new_level - full
    # As the token bucket: the key lives as long as a full bucket takes to leak.
    return AlgorithmResult(ok, remaining, after, level, new_level, retry, (new_level, now), full)


def fixed_window(
    state: tuple[int, int] | None, now: int, cost: int, a: int, b: int
) -> AlgorithmResult:
    """Fixed window; the state is (window index, units charged in it)."""
    index = now // a
    count = state[1] if state is not None and state[0] == index else 0
    reset = (index + 1) * a - now
    ok = count + cost <= b
    left = max(0, b - count)  # a count past the limit is debt: nothing remains
    after = b - count - cost if ok else left
    return AlgorithmResult(
        ok, left, after, reset, reset, 0 if ok else reset, (index, count + cost), reset
    )


def sliding_log(state: list[int] | None, now: int, cost: int, a: int, b: int) -> AlgorithmResult:
    """Sliding log; the state is every charged unit's time, sorted."""
    log = [s for s in state or () if s > now - a]
    count = len(log)
    ok = count + cost <= b
    reset = log[-1] + a - now if log else 0
    if ok:
        written = list(log)
        for _ in range(cost):
            bisect.insort(written, now)
        # The zset's TTL: two windows, kept while it covers one past the newest entry.
        return AlgorithmResult(True, b - count, b - count - cost, reset, a, 0, written, 2 * a)
    retry = log[count + cost - b - 1] + a - now
    left = max(0, b - count)  # more entries than the limit: debt
    return AlgorithmResult(False, left, left, reset, reset, retry, log, 2 * a)


def _counter_reset(index: int, a: int, now: int, c: int, p: int) -> int:
    if c > 0:
        return (index + 2) * a - now
    if p > 0:
        return (index + 1) * a - now
    return 0


def sliding_counter(
    state: tuple[int, int, int] | None, now: int, cost: int, a: int, b: int
) -> AlgorithmResult:
    """Sliding counter; the state is (window index, current count, previous count)."""
    index = now // a
    e = now - index * a
    c = p = 0
    if state is not None and state[0] == index:
        c, p = state[1], state[2]
    elif state is not None and state[0] == index - 1:
        p = state[1]
    weighted = p * (a - e)

    def room(count: int) -> int:
        return max(0, b * a - weighted - count * a) // a

    ok = weighted + (c + cost) * a <= b * a
    reset = _counter_reset(index, a, now, c, p)
    if ok:
        after_reset = _counter_reset(index, a, now, c + cost, p)
        return AlgorithmResult(
            True, room(c), room(c + cost), reset, after_reset, 0, (index, c + cost, p), after_reset
        )
    if c + cost <= b:
        retry = a - (b - c - cost) * a // p - e
    else:
        retry = a - e + max(0, a - (b - cost) * a // c)
    return AlgorithmResult(False, room(c), room(c), reset, reset, retry, None, 0)


#: An algorithm's reference model: (state, now, cost, a, b) -> what it finds.
ModelCheck = Callable[[Any, int, int, int, int], AlgorithmResult]


def decide(
    states: Sequence[Any],
    checks: Sequence[tuple[ModelCheck, int, int]],
    now: int,
    cost: int,
    peek: bool,
) -> tuple[list[int], list[tuple[Any, int]] | None]:
    """Decide ``cost`` against every ``(check, a, b)``, given each one's stored state.

    Returns ``ratelimit/decide.lua``'s reply (``[allowed, then per policy ok,
    remaining, reset_us, retry_us]``) and, when it charged, the ``(state, ttl_us)``
    to store for each policy (``None`` when nothing is written).
    """
    results = [
        check(state, now, cost, a, b) for state, (check, a, b) in zip(states, checks, strict=True)
    ]
    allowed = all(r.ok for r in results)
    reply = [1 if allowed else 0]
    if allowed and not peek:
        for r in results:
            reply += (1, r.remaining_after, r.reset_after, r.retry)
        return reply, [(r.state, r.ttl_us) for r in results]
    for r in results:
        reply += (1 if r.ok else 0, r.remaining, r.reset, r.retry)
    return reply, None
