"""The reference model: every algorithm in pure Python, mirroring the Lua scripts.

Each ``check_*`` function takes a policy's stored state, the time (integer
microseconds), the cost and the policy's two integer parameters, and returns
what the script returns for it plus the state and TTL a charge would write.
``decide`` combines several policies all-or-nothing, like ``rl_decide.lua``.
The in-memory backend runs this model; the differential tests hold the
scripts to it, decision for decision.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["Outcome", "Verdict", "decide", "initial"]


class Outcome(NamedTuple):
    """One policy's answer: admitted or not, units left, µs until reset and until a retry."""

    ok: bool
    remaining: int
    reset_us: int
    retry_us: int


class Verdict(NamedTuple):
    """The answer for every policy of one call; ``allowed`` when all of them admit.

    (Named tuples, not dataclasses: one is built per decision, on the hot path.)
    """

    allowed: bool
    outcomes: tuple[Outcome, ...]

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> Verdict:
        """Parse ``rl_decide.lua``'s flat reply."""
        v = [int(x) for x in reply]
        make = Outcome._make
        outcomes = tuple([make((v[i] == 1, *v[i + 1 : i + 4])) for i in range(1, len(v), 4)])
        return cls(v[0] == 1, outcomes)


@dataclass(frozen=True, slots=True)
class _Check:
    ok: bool
    remaining: int
    remaining_after: int
    reset: int
    reset_after: int
    retry: int
    state: Any  # written on charge
    ttl_us: int  # how long the written state matters


def _gcra(state: int | None, now: int, cost: int, a: int, b: int) -> _Check:
    tau = a * b
    tat = max(now if state is None else state, now)
    new_tat = tat + cost * a
    ok = new_tat - now <= tau
    remaining = (tau - (tat - now)) // a
    after = (tau - (new_tat - now)) // a if ok else remaining
    retry = 0 if ok else new_tat - tau - now
    return _Check(ok, remaining, after, tat - now, new_tat - now, retry, new_tat, new_tat - now)


def _leaky(state: tuple[int, int] | None, now: int, cost: int, a: int, b: int) -> _Check:
    full = a * b
    level, stamp = state if state is not None else (0, now)
    level = max(0, level - max(0, now - stamp))
    new_level = level + cost * a
    ok = new_level <= full
    remaining = (full - level) // a
    after = (full - new_level) // a if ok else remaining
    retry = 0 if ok else new_level - full
    return _Check(ok, remaining, after, level, new_level, retry, (new_level, now), new_level)


def _fixed(state: tuple[int, int] | None, now: int, cost: int, a: int, b: int) -> _Check:
    index = now // a
    count = state[1] if state is not None and state[0] == index else 0
    reset = (index + 1) * a - now
    ok = count + cost <= b
    after = b - count - cost if ok else b - count
    return _Check(
        ok, b - count, after, reset, reset, 0 if ok else reset, (index, count + cost), reset
    )


def _log(state: list[int] | None, now: int, cost: int, a: int, b: int) -> _Check:
    log = [s for s in state or () if s > now - a]
    count = len(log)
    ok = count + cost <= b
    reset = log[-1] + a - now if log else 0
    if ok:
        written = list(log)
        for _ in range(cost):
            bisect.insort(written, now)
        return _Check(True, b - count, b - count - cost, reset, a, 0, written, a)
    retry = log[count + cost - b - 1] + a - now
    return _Check(False, b - count, b - count, reset, reset, retry, log, a)


def _counter_reset(index: int, a: int, now: int, c: int, p: int) -> int:
    if c > 0:
        return (index + 2) * a - now
    if p > 0:
        return (index + 1) * a - now
    return 0


def _counter(state: tuple[int, int, int] | None, now: int, cost: int, a: int, b: int) -> _Check:
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
        return _Check(
            True, room(c), room(c + cost), reset, after_reset, 0, (index, c + cost, p), after_reset
        )
    if c + cost <= b:
        retry = a - (b - c - cost) * a // p - e
    else:
        retry = a - e + max(0, a - (b - cost) * a // c)
    return _Check(False, room(c), room(c), reset, reset, retry, None, 0)


_ALGORITHMS: dict[int, Callable[[Any, int, int, int, int], _Check]] = {
    1: _gcra,
    2: _leaky,
    3: _fixed,
    4: _log,
    5: _counter,
}


def initial() -> None:
    """The state of a key nobody has charged (what a missing Redis key means)."""
    return


def decide(
    states: Sequence[Any],
    specs: Sequence[tuple[int, int, int]],
    now: int,
    cost: int,
    peek: bool,
) -> tuple[Verdict, list[tuple[Any, int]] | None]:
    """Decide ``cost`` against every ``(kind, a, b)`` spec, given each one's stored state.

    Returns the verdict and, when it charged, the ``(state, ttl_us)`` to store
    for each policy (``None`` when nothing is written).
    """
    checks = [
        _ALGORITHMS[kind](state, now, cost, a, b)
        for state, (kind, a, b) in zip(states, specs, strict=True)
    ]
    allowed = all(c.ok for c in checks)
    charge = allowed and not peek
    if charge:
        outcomes = tuple(Outcome(True, c.remaining_after, c.reset_after, c.retry) for c in checks)
        return Verdict(True, outcomes), [(c.state, c.ttl_us) for c in checks]
    outcomes = tuple(Outcome(c.ok, c.remaining, c.reset, c.retry) for c in checks)
    return Verdict(allowed, outcomes), None
