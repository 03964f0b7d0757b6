"""The Lua scripts on real Redis against the Python reference model, call for call.

Time is injected (the scripts' test-only ``now`` argument), so both sides see
the same microseconds; every reply must be identical.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headway import SyncMemoryRateLimitBackend, SyncRedisRateLimitBackend
from headway.ratelimit.policies import Policy
from tests.ratelimit.strategies import ALGORITHMS_BY_NAME, EPOCH_US, policy_sets, steps

pytestmark = pytest.mark.redis

_run = itertools.count()
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def replay(
    client: redis.Redis,
    policies: Sequence[Policy],
    start: int,
    calls: Sequence[tuple[int, int, int, bool]],
) -> None:
    remote = SyncRedisRateLimitBackend(client)
    model = SyncMemoryRateLimitBackend()
    run = next(_run)
    limit = min(p.limit for p in policies)
    now = EPOCH_US + start
    for step, key_index, cost, peek in calls:
        now += step
        key = f"diff-{run}-{key_index}"
        cost = min(cost, limit)
        expected = model.decide(key, policies, cost, peek, now_us=now)
        actual = remote.decide(key, policies, cost, peek, now_us=now)
        assert actual == expected, (policies, now, key, cost, peek)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS_BY_NAME))
def test_each_algorithm_matches_the_model(sync_redis_client: redis.Redis, algorithm: str) -> None:
    @SETTINGS
    @given(policy=ALGORITHMS_BY_NAME[algorithm], start=st.integers(0, 10**9), calls=steps)
    def check(policy: Policy, start: int, calls: list[tuple[int, int, int, bool]]) -> None:
        replay(sync_redis_client, [policy], start, calls)

    check()


@SETTINGS
@given(policies=policy_sets, start=st.integers(0, 10**9), calls=steps)
def test_several_policies_match_the_model(
    sync_redis_client: redis.Redis,
    policies: list[Policy],
    start: int,
    calls: list[tuple[int, int, int, bool]],
) -> None:
    replay(sync_redis_client, policies, start, calls)
