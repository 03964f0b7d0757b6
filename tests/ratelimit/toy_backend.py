"""A toy rate-limit backend: a dict of JSON strings behind the public contract only.

Written from ``docs/extending.md`` ("Add a rate-limit backend") and the docstrings of
``RateLimitBackend``, ``LeasingBackend``, ``state_names``, ``decide_states`` and
``lease_states``; it imports nothing but public names. It joins the shared suite
(``RATE_LIMIT_BACKENDS`` in ``conftest.py``), leased tests included, which shows that a
third party can write a backend without knowing the Redis path.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from headway import (
    Decision,
    Leasing,
    LeasingBackend,
    Policy,
    decide_states,
    lease_states,
    state_names,
)

__all__ = ["DictBackend"]


class DictBackend:
    """One process's rate limits in a dict of JSON strings (states never expire)."""

    name = "dict"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.states: dict[str, str] = {}

    async def decide(self, key: str, policies: Sequence[Policy], cost: int, peek: bool) -> Decision:
        names = state_names(key, policies)
        # No await from the reads to the writes: atomic on one event loop.
        states = [json.loads(self.states.get(name, "null")) for name in names]
        now_us = round(self.clock() * 1_000_000)
        decision, writes = decide_states(policies, states, now_us, cost, peek)
        for name, (state, _ttl_us) in zip(names, writes, strict=False):
            self.states[name] = json.dumps(state)
        return decision

    async def lease(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]] = (0, ()),
    ) -> list[int]:
        names = state_names(key, policies)
        states = [json.loads(self.states.get(name, "null")) for name in names]
        now_us = round(self.clock() * 1_000_000)
        reply, writes = lease_states(policies, states, now_us, cost, leasing, back)
        for name, write in zip(names, writes, strict=True):
            if write is not None:  # a dict never expires a key: the TTL does not matter
                self.states[name] = json.dumps(write[0])
        return reply

    async def reset(self, key: str, policies: Sequence[Policy]) -> None:
        for name in state_names(key, policies):
            self.states.pop(name, None)


_: type[LeasingBackend] = DictBackend  # mypy: the toy keeps the contract, leasing too
