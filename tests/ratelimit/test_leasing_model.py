"""Leased quota against the reference model.

``lease.lua`` on real Redis against ``lease_model`` (through the in-memory backend),
call for call with injected time; and a leasing limiter against a plain one in
one process with a fake clock: windows admit exactly what the plain limiter
admits, buckets keep their bound on the times units are actually spent.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headway import Leasing, MemoryRateLimitBackend, RateLimiter
from headway._clock import FakeClock
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.backends.contract import lease_call
from headway.ratelimit.backends.redis import lease_script
from headway.ratelimit.policies import LeakyBucket, Policy, TokenBucket
from tests.ratelimit.strategies import ALGORITHMS_BY_NAME, EPOCH_US

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
_run = itertools.count()
LEASED = {name: s for name, s in ALGORITHMS_BY_NAME.items() if name != "sliding_log"}
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
    store = MemoryRateLimitBackend()._store  # the model, called as the backend calls it
    run, now = next(_run), EPOCH_US + start
    limit = min(p.limit for p in ps)
    last: dict[str, list[int]] = {}
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
        actual = lease_script(ps).run_sync(client, keys, args)
        assert actual == expected, (ps, leasing, now, key, cost, back)
        if expected[0]:
            last[key] = expected


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
