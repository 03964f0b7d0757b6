"""Leased quota against the reference model.

``lease.lua`` on real Redis against ``lease_model`` (through the in-memory backend),
call for call with injected time; and a leasing limiter against a plain one in
one process with a fake clock: windows admit exactly what the plain limiter
admits, buckets keep their bound on the times units are actually spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headway import Leasing, MemoryRateLimitBackend, RateLimiter
from headway._clock import FakeClock
from headway._redis.sync_wire import SyncWire
from headway.ratelimit.algorithms import ALGORITHMS, PolicySet
from headway.ratelimit.backends.redis_scripts import lease_call, lease_script
from headway.ratelimit.lease_model import NotLeased
from headway.ratelimit.policies import (
    FixedWindow,
    LeakyBucket,
    Policy,
    SlidingCounter,
    TokenBucket,
)
from tests.ratelimit.strategies import ALGORITHMS_BY_NAME, EPOCH_US

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
_run = itertools.count()
#: What the algorithm table says can be leased.
LEASED = {
    a.policy.name: ALGORITHMS_BY_NAME[a.policy.name]
    for a in ALGORITHMS
    if not isinstance(a.lease, NotLeased)
}
leased_sets = st.lists(
    st.one_of(*LEASED.values()), min_size=1, max_size=3, unique_by=lambda p: p.key_part
)
leasings = st.builds(
    Leasing,
    chunk=st.integers(1, 10),
    share=st.sampled_from([0.125, 0.5, 1.0]),
    hold=st.sampled_from([0.001, 0.05, 1.0]),
)
# (us to move forward, which of two keys, cost 1..3, units to give back: none/some/all)
Step = tuple[int, int, int, str]
lease_steps = st.lists(
    st.tuples(
        st.one_of(st.just(0), st.integers(0, 2_000), st.integers(0, 4_000_000)),
        st.integers(0, 1),
        st.integers(0, 3),
        st.sampled_from(["none", "one", "all"]),
    ),
    min_size=1,
    max_size=40,
)


def replay(
    client: redis.Redis,
    policies: Sequence[Policy],
    leasing: Leasing,
    start: int,
    calls: Sequence[Step],
) -> None:
    ps = PolicySet(policies)
    # The script as production calls it (a Redis function).
    wire = SyncWire(client)
    store = MemoryRateLimitBackend()._store  # the model, called as the backend calls it
    run, now = next(_run), EPOCH_US + start
    limit = min(p.limit for p in ps)
    last: dict[str, list[int]] = {}
    try:
        for step, key_index, cost, giving in calls:
            now += step
            key = f"lease-{run}-{key_index}"
            previous = last.get(key)
            back: tuple[int, list[int]] = (0, [])
            if previous is not None and previous[0] > 0 and giving != "none":
                units = previous[0] if giving == "all" else 1
                back = (units, [previous[7 + 7 * i] for i in range(len(ps))])
            cost = min(cost, limit)
            expected = store.lease(key, ps, cost, leasing, back, now)
            keys, args = lease_call(key, ps, cost, leasing, back, now)
            actual = wire.call(lease_script(ps), keys, args)
            assert actual == expected, (ps, leasing, now, key, cost, back)
            if expected[0]:
                last[key] = expected
    finally:
        wire.close()


@pytest.mark.redis
@pytest.mark.parametrize("algorithm", sorted(LEASED))
def test_each_algorithm_leases_as_the_model(sync_redis_client: redis.Redis, algorithm: str) -> None:
    @SETTINGS
    @given(
        policy=LEASED[algorithm], leasing=leasings, start=st.integers(0, 10**9), calls=lease_steps
    )
    def check(policy: Policy, leasing: Leasing, start: int, calls: list[Step]) -> None:
        replay(sync_redis_client, [policy], leasing, start, calls)

    check()


@pytest.mark.redis
@SETTINGS
@given(policies=leased_sets, leasing=leasings, start=st.integers(0, 10**9), calls=lease_steps)
def test_several_policies_lease_as_the_model(
    sync_redis_client: redis.Redis,
    policies: list[Policy],
    leasing: Leasing,
    start: int,
    calls: list[Step],
) -> None:
    replay(sync_redis_client, policies, leasing, start, calls)


# Short real windows: a bucket of 20 refilled in 200 ms, windows of 200 ms.
TTL_SETS: dict[str, list[Policy]] = {
    "token_bucket": [TokenBucket(20, 20, 0.2)],
    "leaky_bucket": [LeakyBucket(20, 20, 0.2)],
    "fixed_window": [FixedWindow(1000, 0.2)],
    "sliding_counter": [SlidingCounter(1000, 0.2)],
    "window and bucket": [FixedWindow(1000, 0.2), TokenBucket(20, 20, 0.2)],
}


@pytest.mark.redis
@pytest.mark.parametrize("name", sorted(TTL_SETS))
def test_a_lease_leaves_the_key_a_ttl_covering_its_states(
    sync_redis_client: redis.Redis, name: str
) -> None:
    """On the server's clock, the key outlives each state it holds (its TTL kept or set).

    The bucket is leased whole, then again once half refilled: a TTL kept from the first
    lease would end 100 ms before the second one's state stops mattering.
    """
    ps, leasing = PolicySet(TTL_SETS[name]), Leasing(chunk=20, share=1.0, hold=0.001)
    key = f"lease-ttl-{next(_run)}"
    checked = []
    for pause in (0.0, 0.0, 0.1, 0.0):
        time.sleep(pause)
        sent = time.monotonic()
        keys, args = lease_call(key, ps, 1, leasing, (0, []), None)
        with contextlib.closing(SyncWire(sync_redis_client)) as wire:
            reply = wire.call(lease_script(ps), keys, args)
        pttl_ms = sync_redis_client.pttl(keys[0])
        elapsed_ms = (time.monotonic() - sent) * 1000
        checked.append(reply[0] > 0)
        if reply[0] == 0:
            continue
        # After a charge each policy's reset is how long its state matters, from the
        # server's now (no earlier than `sent`).
        needed_ms = max(reply[3 + 7 * i] for i in range(len(ps))) / 1000
        assert pttl_ms + elapsed_ms + 1 >= needed_ms, (pause, pttl_ms, needed_ms, reply)
    assert checked[0]  # the first lease
    assert checked[2]  # and the one after the pause


# (us to move forward, cost 1..3, peek?)
hits = st.lists(
    st.tuples(
        st.one_of(st.just(0), st.integers(0, 3_000), st.integers(0, 3_000_000)),
        st.integers(1, 3),
        st.booleans(),
    ),
    min_size=1,
    max_size=60,
)


async def _both(
    policy: Policy, leasing: Leasing, calls: Sequence[tuple[int, int, bool]]
) -> list[tuple[int, bool, int, bool, int, int, bool]]:
    """Each call on a leasing and a plain limiter: time, both answers, cost, peek."""
    clock = FakeClock(1_000.0)
    leased = RateLimiter(policy, backend=MemoryRateLimitBackend(clock), clock=clock, lease=leasing)
    plain = RateLimiter(policy, backend=MemoryRateLimitBackend(clock), clock=clock)
    seen = []
    for step, cost, peek in calls:
        clock.now += step / 1e6
        cost = min(cost, policy.limit)
        a = await (leased.peek("k", cost) if peek else leased.hit("k", cost))
        b = await (plain.peek("k", cost) if peek else plain.hit("k", cost))
        when = round(clock.now * 1e6)
        seen.append((when, a.allowed, a.remaining, b.allowed, b.remaining, cost, peek))
    await leased.return_leases()
    return seen


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_counter"])
def test_leased_windows_admit_what_the_model_admits(algorithm: str) -> None:
    @SETTINGS
    @given(policy=LEASED[algorithm], leasing=leasings, calls=hits)
    def check(policy: Policy, leasing: Leasing, calls: list[tuple[int, int, bool]]) -> None:
        for when, leased, left, plain, plain_left, *_ in asyncio.run(_both(policy, leasing, calls)):
            assert leased == plain, when
            # Remaining: what the lease saw, less its spends; the plain one sees time pass.
            assert left <= plain_left if algorithm == "sliding_counter" else left == plain_left

    check()


@pytest.mark.parametrize("algorithm", ["token_bucket", "leaky_bucket"])
def test_leased_buckets_keep_their_bound_on_spend_times(algorithm: str) -> None:
    @SETTINGS
    @given(policy=LEASED[algorithm], leasing=leasings, calls=hits)
    def check(
        policy: TokenBucket | LeakyBucket, leasing: Leasing, calls: list[tuple[int, int, bool]]
    ) -> None:
        a, b = policy.params()
        seen = asyncio.run(_both(policy, leasing, calls))
        spent = [(when, cost) for when, leased, *_, cost, peek in seen if leased and not peek]
        for i, (s, _) in enumerate(spent):  # any [s, t]: at most b + (t - s) / a units
            total = 0
            for t, cost in spent[i:]:
                total += cost
                assert total <= b + (t - s) // a, (s, t, total)

    check()
