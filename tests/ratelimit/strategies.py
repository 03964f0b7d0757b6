"""Hypothesis strategies: small policies and sequences of timed calls."""

from __future__ import annotations

from hypothesis import strategies as st

from headway import FixedWindow, LeakyBucket, SlidingCounter, SlidingLog, TokenBucket
from headway.ratelimit.policies import Policy

# Around 2024 in server microseconds: big enough to exercise Lua's doubles.
EPOCH_US = 1_700_000_000_000_000

PERIODS = st.sampled_from([0.001, 0.007, 0.25, 1.0, 3.0])


def buckets(kind: type[TokenBucket] | type[LeakyBucket]) -> st.SearchStrategy[Policy]:
    return st.builds(kind, st.integers(1, 8), st.integers(1, 5), PERIODS)


def windows(
    kind: type[FixedWindow] | type[SlidingLog] | type[SlidingCounter],
) -> st.SearchStrategy[Policy]:
    return st.builds(kind, st.integers(1, 8), PERIODS)


ALGORITHMS: dict[str, st.SearchStrategy[Policy]] = {
    "token_bucket": buckets(TokenBucket),
    "leaky_bucket": buckets(LeakyBucket),
    "fixed_window": windows(FixedWindow),
    "sliding_log": windows(SlidingLog),
    "sliding_counter": windows(SlidingCounter),
}

any_policy = st.one_of(*ALGORITHMS.values())

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
