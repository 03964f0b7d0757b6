"""Which Lua script a rate-limit call runs, its keys and arguments, packed once per policy set.

``state_keys``, ``decide_call`` and ``lease_call`` say what a call of
``ratelimit/decide_one.lua`` (one policy), ``ratelimit/decide.lua`` or
``ratelimit/lease.lua`` sends. ``decide_script`` and
``lease_script`` combine a main script (``ratelimit/decide_one``,
``ratelimit/decide`` or ``ratelimit/lease``) with the library script and the fragments
of just the algorithms the policies use, one ``Script`` per combination. ``Packing``
keeps what the async Redis backend sends for one policy set (script, arguments, state
keys) packed, so a decision on headway's connection packs nothing twice. Concurrency
slots run the semaphore's scripts (``lock.backends.redis.mode_keys``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headway._clock import Clock
from headway._keys import tag_base
from headway._redis.resp import Packed, pack, pack_keys
from headway._redis.scripts import Script
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.leasing import Leasing
from headway.ratelimit.policies import Policy

__all__ = [
    "Packing",
    "decide_call",
    "decide_many_call",
    "decide_script",
    "lease_call",
    "lease_script",
    "micros",
    "packing_in",
    "reserve_call",
    "reserve_script",
    "settle_call",
    "settle_script",
    "state_keys",
]

_DECIDE: dict[tuple[bool, tuple[int, ...]], Script] = {}
_LEASE: dict[tuple[int, ...], Script] = {}
_RESERVE: dict[tuple[int, ...], Script] = {}
_SETTLE: dict[tuple[int, ...], Script] = {}


def state_keys(key: str, policies: Sequence[Policy]) -> list[str]:
    """The Redis keys holding ``key``'s state (``PolicySet.stored``), sharing its hash tag."""
    base = tag_base("rl", key)
    return [base + suffix for suffix in PolicySet.of(policies).stored]


def decide_call(
    key: str, policies: Sequence[Policy], cost: int, peek: bool, now_us: int | None
) -> tuple[list[str], list[int | str]]:
    """Keys and arguments of the script ``decide_script`` picks (``now_us`` None: the
    server's ``TIME``): ``ratelimit/decide_one.lua``'s for one policy (``a, b, cost`` with
    a peek's cost negated, then ``now_us`` if any), else ``decide_many_call``'s."""
    policies = PolicySet.of(policies)
    if len(policies) > 1:
        return decide_many_call(key, policies, cost, peek, now_us)
    _, a, b = policies.specs[0]
    args: list[int | str] = [a, b, -cost if peek else cost]
    if now_us is not None:
        args.append(now_us)
    return state_keys(key, policies), args


def decide_many_call(
    key: str, policies: Sequence[Policy], cost: int, peek: bool, now_us: int | None
) -> tuple[list[str], list[int | str]]:
    """Keys and arguments of ``ratelimit/decide.lua`` (``now_us`` None: the server's ``TIME``)."""
    policies = PolicySet.of(policies)
    head = ["" if now_us is None else now_us, cost, 1 if peek else 0]
    return state_keys(key, policies), [*head, *policies.flat]


def lease_call(
    key: str,
    policies: PolicySet,
    cost: int,
    leasing: Leasing,
    back: tuple[int, Sequence[int]],
    now_us: int | None,
) -> tuple[list[str], list[int | str]]:
    """Keys and arguments of ``ratelimit/lease.lua`` (``now_us`` None: the server's ``TIME``)."""
    units, marks = back
    now: int | str = "" if now_us is None else now_us
    head = [now, cost, leasing.chunk, leasing.permille, leasing.hold_us, units]
    for i, (kind, a, b) in enumerate(policies.specs):
        head += (kind, a, b, marks[i] if units else 0)
    return state_keys(key, policies), head


def reserve_call(
    key: str, policies: Sequence[Policy], costs: Sequence[int], now_us: int | None
) -> tuple[list[str], list[int | str]]:
    """Keys and arguments of ``ratelimit/reserve.lua`` (``now_us`` None: the server's ``TIME``)."""
    policies = PolicySet.of(policies)
    args: list[int | str] = ["" if now_us is None else now_us]
    for spec, cost in zip(policies.specs, costs, strict=True):
        args += (*spec, cost)
    return state_keys(key, policies), args


def settle_call(
    key: str,
    policies: Sequence[Policy],
    at_us: int,
    charged: Sequence[int],
    actual: Sequence[int],
    now_us: int | None,
) -> tuple[list[str], list[int | str]]:
    """Keys and arguments of ``ratelimit/settle.lua`` (``now_us`` None: the server's ``TIME``)."""
    policies = PolicySet.of(policies)
    args: list[int | str] = ["" if now_us is None else now_us, at_us]
    for spec, c, x in zip(policies.specs, charged, actual, strict=True):
        args += (*spec, c, x)
    return state_keys(key, policies), args


def reserve_script(policies: Sequence[Policy]) -> Script:
    """``ratelimit/reserve.lua`` with the fragments of the algorithms ``policies`` use."""
    used = PolicySet.of(policies).algorithms
    kinds = tuple(a.kind for a in used)
    script = _RESERVE.get(kinds)
    if script is None:
        include = ("clock", "ratelimit/common", *(a.fragment for a in used))
        script = _RESERVE[kinds] = Script("ratelimit/reserve", include=include)
    return script


def settle_script(policies: Sequence[Policy]) -> Script:
    """``ratelimit/settle.lua`` with the settle fragments of the algorithms ``policies`` use."""
    used = PolicySet.of(policies).algorithms
    kinds = tuple(a.kind for a in used)
    script = _SETTLE.get(kinds)
    if script is None:
        fragments = (a.settle_fragment for a in used)
        include = ("clock", "ratelimit/common", "ratelimit/settling", *fragments)
        script = _SETTLE[kinds] = Script("ratelimit/settle", include=include)
    return script


def decide_script(policies: Sequence[Policy]) -> Script:
    """The script deciding ``policies``, with just the algorithms they use (defined per call).

    One policy runs ``ratelimit/decide_one.lua``, several ``ratelimit/decide.lua``: the same
    reply and state, the first without the loops and tables several need, and with fewer
    arguments (``decide_call``).
    """
    policies = PolicySet.of(policies)
    kinds = tuple(a.kind for a in policies.algorithms)
    alone = len(policies) == 1
    script = _DECIDE.get((alone, kinds))
    if script is None:
        include = ("clock", "ratelimit/common", *(a.fragment for a in policies.algorithms))
        main = "ratelimit/decide_one" if alone else "ratelimit/decide"
        script = _DECIDE[(alone, kinds)] = Script(main, include=include)
    return script


def lease_script(policies: PolicySet) -> Script:
    """``ratelimit/lease.lua`` with the fragments of the algorithms ``policies`` use.

    After each algorithm's fragment and the leasing library, the lease fragment its
    entry in ``ALGORITHMS`` declares (ValueError for an algorithm that is not leased).
    """
    used = policies.algorithms
    kinds = tuple(a.kind for a in used)
    script = _LEASE.get(kinds)
    if script is None:
        leases = [a.leased().fragment for a in used]
        include = (
            "clock", "ratelimit/common", *(a.fragment for a in used), "ratelimit/leasing", *leases
        )  # fmt: skip
        script = _LEASE[kinds] = Script("ratelimit/lease", include=include)
    return script


def _kept(cache: dict[Any, Packed], key: Any, packed: Packed, bound: int) -> Packed:
    """Remember ``packed`` under ``key``, starting afresh once ``bound`` entries are kept."""
    if len(cache) >= bound:
        cache.clear()
    cache[key] = packed
    return packed


class Packing:
    """What the calls of one policy set send, packed once: script, arguments, state keys."""

    __slots__ = (
        "args", "keys", "lease_args", "lease_script", "policies", "reserve_args",
        "reserve_script", "script",
    )  # fmt: skip

    def __init__(self, policies: PolicySet) -> None:
        self.policies = policies
        self.script = decide_script(policies)
        self.args: dict[tuple[int, bool], Packed] = {}
        self.keys: dict[str, Packed] = {}
        self.lease_script: Script | None = None  # made on the first lease (if leasable)
        self.lease_args: dict[tuple[int, Leasing], Packed] = {}
        self.reserve_script = reserve_script(policies)
        self.reserve_args: dict[tuple[int, ...], Packed] = {}

    def packed_args(self, cost: int, peek: bool) -> Packed:
        # Costs vary little; a caller that varies them a lot pays packing.
        return self.args.get((cost, peek)) or _kept(
            self.args, (cost, peek), pack(decide_call("", self.policies, cost, peek, None)[1]), 64
        )

    def packed_lease(self, cost: int, leasing: Leasing) -> Packed:
        # A lease that gives nothing back sends only the limiter's own values but the cost.
        return self.lease_args.get((cost, leasing)) or _kept(
            self.lease_args,
            (cost, leasing),
            pack(lease_call("", self.policies, cost, leasing, (0, ()), None)[1]),
            64,
        )

    def packed_reserve(self, costs: tuple[int, ...]) -> Packed:
        # An endpoint's estimates repeat (its max_tokens): packed once each, a few kept.
        return self.reserve_args.get(costs) or _kept(
            self.reserve_args, costs, pack(reserve_call("", self.policies, costs, None)[1]), 64
        )

    def packed_keys(self, key: str) -> Packed:
        # A flood of distinct keys re-packs; a hot set stays packed.
        return self.keys.get(key) or _kept(
            self.keys, key, pack_keys(state_keys(key, self.policies)), 4096
        )


def packing_in(packings: dict[PolicySet, Packing], policies: PolicySet) -> Packing:
    """``policies``' packing in ``packings``, made (and kept) if missing."""
    packing = packings.get(policies)
    if packing is None:
        if len(packings) >= 256:  # policies made per request: start afresh
            packings.clear()
        packing = packings[policies] = Packing(policies)
    return packing


def micros(clock: Clock | None) -> int | None:
    """``clock``'s time in whole microseconds, or None: the scripts then read ``TIME``."""
    return None if clock is None else round(clock() * 1_000_000)
