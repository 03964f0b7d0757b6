"""Leased quota for ``SyncRateLimiter``: threads counted exactly, give-backs, outages."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator

import pytest
import redis

from headway import (
    FixedWindow,
    Leasing,
    SlidingLog,
    Source,
    SyncMemoryRateLimitBackend,
    SyncRateLimiter,
    SyncRedisRateLimitBackend,
    TokenBucket,
)
from headway._clock import FakeClock
from headway.ratelimit.backends.leasing_contract import SyncLeasingBackend
from headway.ratelimit.policies import OnError

SyncFactory = Callable[[], SyncLeasingBackend]
THREADS = 8


@pytest.fixture(params=["memory", "redis"])
def make_sync_backend(request: pytest.FixtureRequest) -> Iterator[SyncFactory]:
    """Builds sync backends of one kind, sharing one state (one memory store, one Redis)."""
    if request.param == "memory":
        shared = SyncMemoryRateLimitBackend()
        yield lambda: shared
        return
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    client.flushdb()
    made: list[SyncRedisRateLimitBackend] = []

    def make() -> SyncRedisRateLimitBackend:
        made.append(SyncRedisRateLimitBackend(client))
        return made[-1]

    try:
        yield make
    finally:
        for backend in made:
            backend.close()
        client.close()


def test_leased_and_plain_sync_limiters_admit_the_same(make_sync_backend: SyncFactory) -> None:
    leased = SyncRateLimiter(FixedWindow(50, 3600.0), backend=make_sync_backend(), lease=Leasing(8))
    admitted = [leased.hit("k") for _ in range(60)]
    assert sum(d.allowed for d in admitted) == 50
    assert [d.remaining for d in admitted[:50]] == list(range(49, -1, -1))
    assert all(d.source is Source.BACKEND for d in admitted)
    assert not admitted[-1].allowed
    assert 0 < admitted[-1].retry_after <= 3600


@pytest.mark.parametrize("policy", [FixedWindow(300, 3600.0), TokenBucket(300, 1, 3600.0)])
def test_threads_of_two_limiters_never_admit_more_than_the_quota(
    make_sync_backend: SyncFactory, policy: FixedWindow | TokenBucket
) -> None:
    # Two limiters (two processes, as far as the backend knows), threads on each, all
    # started together; each thread asks for more than its share.
    leasing = Leasing(chunk=16, share=0.25)
    limiters = [SyncRateLimiter(policy, backend=make_sync_backend(), lease=leasing) for _ in "ab"]
    start = threading.Barrier(2 * THREADS)
    counts: list[int] = []

    def hammer(limiter: SyncRateLimiter) -> None:
        start.wait(timeout=30)
        counts.append(sum(limiter.hit("k").allowed for _ in range(60)))

    threads = [
        threading.Thread(target=hammer, args=(limiter,))
        for limiter in limiters
        for _ in range(THREADS)
    ]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: races show
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        sys.setswitchinterval(interval)
    assert len(counts) == 2 * THREADS
    for limiter in limiters:  # units still parked in leases go back...
        limiter.return_leases()
    plain = SyncRateLimiter(policy, backend=make_sync_backend())
    drained = 0
    while plain.hit("k").allowed:  # ... and are admitted here: exactly the quota in all
        drained += 1
    assert sum(counts) > 0
    if isinstance(policy, FixedWindow):
        assert sum(counts) + drained == 300
    else:  # a bucket takes units back only while no charge came since: some stay charged
        assert sum(counts) + drained <= 300


def test_a_lapsed_lease_goes_back_with_the_next_lease_call(
    make_sync_backend: SyncFactory,
) -> None:
    clock = FakeClock()
    policy = FixedWindow(10, 3600.0)
    idle = SyncRateLimiter(
        policy, backend=make_sync_backend(), clock=clock, lease=Leasing(10, 1, hold=0.05)
    )
    busy = SyncRateLimiter(policy, backend=make_sync_backend(), lease=Leasing(10, 1))
    assert idle.hit("k").allowed  # leases all 10
    assert not busy.hit("k").allowed
    clock.advance(0.04)
    assert idle.hit("other").allowed  # within the hold: "k"'s lease stays
    assert not busy.hit("k").allowed
    clock.advance(0.02)
    assert idle.hit("third").allowed  # past it: "k"'s 9 unspent units go back with this call
    assert sum(busy.hit("k").allowed for _ in range(12)) == 9


def test_reset_and_peek_give_the_lease_up(make_sync_backend: SyncFactory) -> None:
    backend = make_sync_backend()
    limiter = SyncRateLimiter(FixedWindow(10, 3600.0), backend=backend, lease=Leasing(10, 1))
    assert limiter.hit("k").allowed  # leases all 10
    peeked = limiter.peek("k")  # the backend answers: 9 unspent units went back first
    assert peeked.allowed
    assert peeked.remaining == 9
    limiter.reset("k")
    assert sum(limiter.hit("k").allowed for _ in range(15)) == 10


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_an_unreachable_redis_decides_as_the_policy_says(on_error: OnError) -> None:
    backend = SyncRedisRateLimitBackend.from_url("redis://127.0.0.1:1", timeout=0.5)  # refused
    limiter = SyncRateLimiter(
        FixedWindow(10, 3600.0, on_error=on_error), backend=backend, lease=Leasing()
    )
    decision = limiter.hit("k")
    assert decision.failed
    assert decision.allowed is (on_error == "allow")
    limiter.return_leases()  # nothing held: nothing to give back
    backend.close()
    backend.client.close()


def test_sliding_logs_and_backends_without_leases_are_refused() -> None:
    with pytest.raises(ValueError, match="sliding log"):
        SyncRateLimiter(SlidingLog(5), lease=Leasing())

    class Plain(SyncMemoryRateLimitBackend):
        lease = None  # type: ignore[assignment]

    with pytest.raises(TypeError, match="cannot lease"):
        SyncRateLimiter(FixedWindow(5), backend=Plain(), lease=Leasing())
