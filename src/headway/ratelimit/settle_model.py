"""Reserve, then settle: the reference model of ``ratelimit/reserve.lua`` and ``settle.lua``.

A reservation charges each policy its own cost at once (``reserve``: a metered policy
its estimate, a request policy 1), all-or-nothing, through each algorithm's ``check``
(``model``), at the server time ``at``. Settling it with the actual cost changes each
metered policy's state by ``actual - charged`` units, as the reservation's charge
would have been had it been the actual cost, as far as the state still holds it
(``settle``; each algorithm's rule in ``SETTLE_RULES`` and ``lua/ratelimit/settling/``).
An extra charge may take a state past its limit: the key is in debt, and every later
call is refused until it is paid (a bucket refills, a window ends or slides past it).

Every string state is rewritten *normalised* to ``now`` (the same reads at every later
time: a past arrival time as ``now``, a bucket's level leaked to ``now``, a window's
count only if it is still the current window's), adjusted where the rule says so, with
the TTL that covers it: one ``SET PX`` writes them all, as ``decide.lua`` does.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

from headway.ratelimit.model import ModelCheck

__all__ = [
    "DEBT_CAP",
    "ModelSettle",
    "fixed_window",
    "leaky_bucket",
    "reserve",
    "settle",
    "sliding_counter",
    "sliding_log",
    "token_bucket",
]

#: The most a bucket may owe (us of refill) or a window may count: every value stays
#: exact in Lua's doubles (2**51 + a server's now in us < 2**53).
DEBT_CAP = 2**51

#: An algorithm's settle rule: (state, now, at, charged, actual, a, b) -> (state, ttl_us),
#: or None to leave the state as it is.
ModelSettle = Callable[[Any, int, int, int, int, int, int], "tuple[Any, int] | None"]


def _adjusted(value: int, charged: int, actual: int, unit: int) -> int:
    """``value`` (units times ``unit``) with ``actual - charged`` units added, floor 0."""
    if actual < charged:
        return max(0, value - (charged - actual) * unit)
    return min(DEBT_CAP, value + (actual - charged) * unit)


def token_bucket(
    state: int | None, now: int, at: int, charged: int, actual: int, a: int, b: int
) -> tuple[int, int]:
    """Tokens back (the arrival time earlier, never before now: capped at capacity), or
    the rest charged (later: past ``now + a * b`` is debt)."""
    tat = max(now if state is None else state, now)
    tat = now + _adjusted(tat - now, charged, actual, a)
    return tat, max(a * b, tat - now)


def leaky_bucket(
    state: tuple[int, int] | None, now: int, at: int, charged: int, actual: int, a: int, b: int
) -> tuple[tuple[int, int], int]:
    """The level leaked to now, less the refund (floor empty) or plus the rest (past
    full is debt)."""
    level, stamp = state if state is not None else (0, now)
    level = _adjusted(max(0, level - max(0, now - stamp)), charged, actual, a)
    return (level, now), max(a * b, level)


def fixed_window(
    state: tuple[int, int] | None, now: int, at: int, charged: int, actual: int, a: int, b: int
) -> tuple[tuple[int, int], int]:
    """The count changes only while the reservation's window is the current one."""
    index = now // a
    count = state[1] if state is not None and state[0] == index else 0
    if at // a == index:
        count = _adjusted(count, charged, actual, 1)
    return (index, count), (index + 1) * a - now


def sliding_counter(
    state: tuple[int, int, int] | None,
    now: int,
    at: int,
    charged: int,
    actual: int,
    a: int,
    b: int,
) -> tuple[tuple[int, int, int], int]:
    """The reservation's window changes while it weighs: as the current window's count,
    or, the window after, as the previous one's."""
    index = now // a
    c = p = 0
    if state is not None and state[0] == index:
        c, p = state[1], state[2]
    elif state is not None and state[0] == index - 1:
        p = state[1]
    if at // a == index:
        c = _adjusted(c, charged, actual, 1)
    elif at // a == index - 1:
        p = _adjusted(p, charged, actual, 1)
    return (index, c, p), (index + 2) * a - now


def sliding_log(
    state: list[int] | None, now: int, at: int, charged: int, actual: int, a: int, b: int
) -> tuple[list[int], int] | None:
    """Entries stamped ``at`` removed or added while ``at`` is in the window.

    A reservation counts at most ``b`` entries: its entries share one time and leave the
    window together, so more than the limit decides nothing more (docs/ratelimit.md).
    """
    charged, actual = min(charged, b), min(actual, b)
    if at <= now - a or actual == charged:
        return None
    log = [s for s in state or () if s > now - a]
    if actual < charged:
        for _ in range(charged - actual):
            i = bisect.bisect_left(log, at)
            if i == len(log) or log[i] != at:
                break
            del log[i]
    else:
        for _ in range(actual - charged):
            bisect.insort(log, at)
    return log, 2 * a


def reserve(
    states: Sequence[Any],
    checks: Sequence[tuple[ModelCheck, int, int]],
    now: int,
    costs: Sequence[int],
) -> tuple[list[int], list[tuple[Any, int]] | None]:
    """Charge each policy its own cost, all-or-nothing: ``ratelimit/reserve.lua``.

    Returns the reply (``decide.lua``'s, then ``now``) and, when it charged, the
    ``(state, ttl_us)`` to store per policy.
    """
    results = [
        check(state, now, cost, a, b)
        for state, (check, a, b), cost in zip(states, checks, costs, strict=True)
    ]
    allowed = all(r.ok for r in results)
    reply = [1 if allowed else 0]
    for r in results:
        if allowed:
            reply += (1, r.remaining_after, r.reset_after, 0)
        else:
            reply += (1 if r.ok else 0, r.remaining, r.reset, r.retry)
    reply.append(now)
    return reply, [(r.state, r.ttl_us) for r in results] if allowed else None


def settle(
    states: Sequence[Any],
    rules: Sequence[tuple[ModelSettle, int, int]],
    now: int,
    at: int,
    charged: Sequence[int],
    actual: Sequence[int],
) -> list[tuple[Any, int] | None]:
    """Settle a reservation made at ``at``: the ``(state, ttl_us)`` to store per policy
    (None: leave it), as ``ratelimit/settle.lua`` writes them."""
    return [
        rule(state, now, at, c, x, a, b)
        for state, (rule, a, b), c, x in zip(states, rules, charged, actual, strict=True)
    ]
