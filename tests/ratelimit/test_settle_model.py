"""Reserve and settle: the Lua scripts on real Redis against the reference model, call
for call, with injected time (as ``test_differential.py`` does for decisions).

Every step is a reservation (a metered policy charged the estimate, the others 1), a
settle of an earlier reservation at a random actual cost (a refund, the rest, or debt),
or a plain decision; after each one both sides peek at every key, so a state the
settle changed differently shows in the next answer.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headway import FakeClock, SyncMemoryRateLimitBackend, SyncRedisRateLimitBackend
from headway.ratelimit.policies import Policy
from tests.ratelimit.strategies import (
    ALGORITHMS_BY_NAME,
    EPOCH_US,
    any_policy,
    policy_sets,
    set_us,
)

pytestmark = pytest.mark.redis

_run = itertools.count()
SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# (us to move forward, which of two keys, op, n): op 0 reserves an estimate of n, op 1
# settles the n-th reservation still open (at an actual of c * n // 4 + n % 3: refunds,
# the rest, and debt), op 2 decides a cost of 1.
ops = st.lists(
    st.tuples(
        st.one_of(st.just(0), st.integers(0, 3_000), st.integers(0, 4_000_000)),
        st.integers(0, 1),
        st.sampled_from([0, 0, 1, 1, 2]),
        st.integers(0, 9),
    ),
    min_size=1,
    max_size=40,
)


@pytest.fixture
def remote(sync_redis_client: redis.Redis) -> Iterator[SyncRedisRateLimitBackend]:
    """One backend per test (its connection is reused by every example), on a test clock."""
    with contextlib.closing(SyncRedisRateLimitBackend(sync_redis_client, clock=FakeClock())) as b:
        yield b


def replay(
    remote: SyncRedisRateLimitBackend,
    policies: Sequence[Policy],
    metered: Sequence[bool],
    start: int,
    steps: Sequence[tuple[int, int, int, int]],
) -> None:
    clock = remote.clock
    assert isinstance(clock, FakeClock)
    _replay(remote, SyncMemoryRateLimitBackend(clock=clock), clock, policies, metered, start, steps)


def _replay(
    remote: SyncRedisRateLimitBackend,
    model: SyncMemoryRateLimitBackend,
    clock: FakeClock,
    policies: Sequence[Policy],
    metered: Sequence[bool],
    start: int,
    steps: Sequence[tuple[int, int, int, int]],
) -> None:
    run = next(_run)
    smallest = min((p.limit for p, m in zip(policies, metered, strict=True) if m), default=1)
    open_: list[tuple[str, int, list[int]]] = []
    now = EPOCH_US + start
    for step, key_index, op, n in steps:
        now += step
        set_us(clock, now)
        key = f"settle-{run}-{key_index}"
        if op == 0:
            costs = [min(n, smallest) if m else 1 for m in metered]
            expected = model.reserve(key, policies, costs)
            assert remote.reserve(key, policies, costs) == expected, (policies, now, costs)
            if expected[0].allowed:
                open_.append((key, expected[1], costs))
        elif op == 1 and open_:
            key, at, charged = open_.pop(n % len(open_))
            actual = [c * n // 4 + n % 3 if m else c for c, m in zip(charged, metered, strict=True)]
            assert model.settle(key, policies, at, charged, actual) == now
            assert remote.settle(key, policies, at, charged, actual) == now
        elif op == 2:
            assert remote.decide(key, policies, 1, False) == model.decide(key, policies, 1, False)
        for other in (f"settle-{run}-0", f"settle-{run}-1"):
            peeked = model.decide(other, policies, 1, True)
            assert remote.decide(other, policies, 1, True) == peeked, (policies, now, other)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS_BY_NAME))
def test_each_algorithm_settles_as_the_model(
    remote: SyncRedisRateLimitBackend, algorithm: str
) -> None:
    @SETTINGS
    @given(policy=ALGORITHMS_BY_NAME[algorithm], start=st.integers(0, 10**9), steps=ops)
    def check(policy: Policy, start: int, steps: list[tuple[int, int, int, int]]) -> None:
        replay(remote, [policy], [True], start, steps)

    check()


@SETTINGS
@given(
    policies=policy_sets,
    metered=st.lists(st.booleans(), min_size=3, max_size=3),
    start=st.integers(0, 10**9),
    steps=ops,
)
def test_several_policies_settle_as_the_model(
    remote: SyncRedisRateLimitBackend,
    policies: list[Policy],
    metered: list[bool],
    start: int,
    steps: list[tuple[int, int, int, int]],
) -> None:
    # A request policy and a metered one, at least: what an LLM endpoint limits.
    mask = metered[: len(policies)]
    replay(remote, policies, mask, start, steps)


@given(policy=any_policy)
@settings(max_examples=25, deadline=None)
def test_a_key_in_debt_refuses_and_reports_nothing_left(policy: Policy) -> None:
    """A settle far past the limit: every cost refused, nothing remaining, a wait."""
    clock = FakeClock()
    set_us(clock, EPOCH_US)
    model = SyncMemoryRateLimitBackend(clock=clock)
    decision, at = model.reserve("k", [policy], [1])
    assert decision.allowed
    model.settle("k", [policy], at, [1], [policy.limit * 3])
    refused = model.decide("k", [policy], 1, True)
    assert not refused.allowed
    assert refused.remaining == 0
    assert refused.retry_after > 0
