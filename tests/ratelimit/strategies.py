"""Hypothesis strategies: small policies of every algorithm in the table, timed calls."""

from __future__ import annotations

import dataclasses
import typing

from hypothesis import strategies as st

from headway._clock import FakeClock
from headway.ratelimit.algorithms import ALGORITHMS
from headway.ratelimit.policies import Policy

# Around 2024 in server microseconds: big enough to exercise Lua's doubles.
EPOCH_US = 1_700_000_000_000_000


def set_us(clock: FakeClock, now_us: int) -> None:
    """Set ``clock`` to ``now_us`` microseconds (which backends read back exactly)."""
    clock.now = now_us / 1_000_000
    assert round(clock() * 1_000_000) == now_us


PERIODS = st.sampled_from([0.001, 0.007, 0.25, 1.0, 3.0])


#: A small value per parameter type: units, and seconds.
SMALL: dict[object, st.SearchStrategy[object]] = {int: st.integers(1, 8), float: PERIODS}


def small(policy: type[Policy]) -> st.SearchStrategy[Policy]:
    """Policies of one class, every parameter but ``on_error`` small."""
    hints = typing.get_type_hints(policy)
    fields = [f.name for f in dataclasses.fields(policy) if f.name != "on_error"]
    return st.builds(policy, *(SMALL[hints[name]] for name in fields))


#: Every algorithm, by its policy's name: a new one in the table is tested unedited.
ALGORITHMS_BY_NAME: dict[str, st.SearchStrategy[Policy]] = {
    a.policy.name: small(a.policy) for a in ALGORITHMS
}

any_policy = st.one_of(*ALGORITHMS_BY_NAME.values())

policy_sets = st.lists(any_policy, min_size=1, max_size=3, unique_by=lambda p: p.key_part)

# (microseconds to move forward, which of three keys, cost 1..3, peek?)
steps = st.lists(
    st.tuples(
        st.one_of(st.just(0), st.integers(0, 2_000), st.integers(0, 4_000_000)),
        st.integers(0, 2),
        st.integers(1, 3),
        st.booleans(),
    ),
    min_size=1,
    max_size=40,
)
