"""The Lua scripts on real Redis against the Python reference model, call for call.

Time is injected: both backends read one ``FakeClock`` (the Redis backend sends it in
place of the server's ``TIME``), so both sides see the same microseconds; every reply
must be identical.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headway import FakeClock, SyncMemoryRateLimitBackend, SyncRedisRateLimitBackend
from headway._redis.scripts import Script
from headway._redis.sync_wire import SyncWire
from headway.ratelimit.algorithms import algorithm_of
from headway.ratelimit.backends.redis_scripts import decide_call, decide_many_call, decide_script
from headway.ratelimit.decision import decision_from_decide, decision_from_reply
from headway.ratelimit.policies import Policy, SlidingLog
from tests.ratelimit.strategies import (
    ALGORITHMS_BY_NAME,
    EPOCH_US,
    any_policy,
    policy_sets,
    set_us,
    steps,
)

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
    clock = FakeClock()
    remote = SyncRedisRateLimitBackend(client, clock=clock)
    model = SyncMemoryRateLimitBackend(clock=clock)
    run = next(_run)
    limit = min(p.limit for p in policies)
    now = EPOCH_US + start
    for step, key_index, cost, peek in calls:
        now += step
        key = f"diff-{run}-{key_index}"
        cost = min(cost, limit)
        set_us(clock, now)
        expected = model.decide(key, policies, cost, peek)
        actual = remote.decide(key, policies, cost, peek)
        assert actual == expected, (policies, now, key, cost, peek)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS_BY_NAME))
def test_each_algorithm_matches_the_model(sync_redis_client: redis.Redis, algorithm: str) -> None:
    @SETTINGS
    @given(policy=ALGORITHMS_BY_NAME[algorithm], start=st.integers(0, 10**9), calls=steps)
    def check(policy: Policy, start: int, calls: list[tuple[int, int, int, bool]]) -> None:
        replay(sync_redis_client, [policy], start, calls)

    check()


def test_a_log_refused_after_pruning_waits_for_its_oldest_entry_left(
    sync_redis_client: redis.Redis,
) -> None:
    """A full log whose oldest entry has left the window, refused a cost of 2 even so:
    its retry waits for the oldest entry in the window, not for the one just pruned."""
    calls = [(0, 0, 1, False), (500_000, 0, 1, False), (100_000, 0, 1, False)]
    replay(sync_redis_client, [SlidingLog(3, 1.0)], 0, [*calls, (450_000, 0, 2, False)])


@SETTINGS
@given(policies=policy_sets, start=st.integers(0, 10**9), calls=steps)
def test_several_policies_match_the_model(
    sync_redis_client: redis.Redis,
    policies: list[Policy],
    start: int,
    calls: list[tuple[int, int, int, bool]],
) -> None:
    replay(sync_redis_client, policies, start, calls)


def _stored(client: redis.Redis, key: str) -> object:
    """What a key holds: a string state, or a sliding log's entries with their times."""
    if client.type(key) == b"zset":
        return client.zrange(key, 0, -1, withscores=True)
    return client.get(key)


@SETTINGS
@given(policy=any_policy, start=st.integers(0, 10**9), calls=steps)
def test_the_one_policy_script_matches_the_general_one(
    sync_redis_client: redis.Redis,
    policy: Policy,
    start: int,
    calls: list[tuple[int, int, int, bool]],
) -> None:
    """``decide_one.lua`` replies and writes what ``decide.lua`` does for one policy.

    The first runs as production runs it (a Redis function, ``FCALL``), the second as an
    ``EVAL`` script (how a server without functions runs both).
    """
    one = decide_script([policy])
    include = ("clock", "ratelimit/common", algorithm_of(policy).fragment)
    general = Script("ratelimit/decide", include=include)
    assert one.name == "ratelimit/decide_one"
    run = next(_run)
    with contextlib.closing(SyncWire(sync_redis_client)) as wire:
        now = EPOCH_US + start
        for step, key_index, cost, peek in calls:
            now += step
            cost = min(cost, policy.limit)
            replies = []
            for script, call in ((one, decide_call), (general, decide_many_call)):
                keys, args = call(f"{script.name}-{run}-{key_index}", [policy], cost, peek, now)
                if script is one:
                    reply = wire.call(script, keys, args)
                else:
                    reply = script.run_sync(sync_redis_client, keys, args)
                replies.append((reply, keys[0]))
            (mine, my_key), (theirs, their_key) = replies
            # decide_one answers one integer where it can (its header); the same decision.
            mine_read = decision_from_decide(mine, [policy])
            assert mine_read == decision_from_reply(theirs, [policy]), (policy, now, cost, peek)
            assert _stored(sync_redis_client, my_key) == _stored(sync_redis_client, their_key)
            # Both keys live while their state matters (from the test clock, with its grace).
            assert (sync_redis_client.pttl(my_key) > 0) is (sync_redis_client.pttl(their_key) > 0)
