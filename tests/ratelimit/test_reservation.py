"""Reserve, then settle, through the limiters over every backend that reserves."""

from __future__ import annotations

import os
import signal

import anyio
import pytest
from redis import asyncio as aioredis

from headway import (
    Decision,
    FakeClock,
    FixedWindow,
    Leasing,
    RateLimiter,
    RedisRateLimitBackend,
    Reservation,
    SlidingLog,
    Source,
    SyncMemoryRateLimitBackend,
    SyncRateLimiter,
    TokenBucket,
)
from headway.ratelimit.policies import Policy
from tests.ratelimit.conftest import BackendFactory
from tests.ratelimit.toy_backend import DictBackend
from tests.servers import Server, free_port
from tests.windows import NO_ROLLOVER

pytestmark = [pytest.mark.anyio, pytest.mark.needs("reserve")]

REQUESTS = FixedWindow(10, NO_ROLLOVER)
# A day to refill: nothing comes back while a test runs.
TOKENS = TokenBucket(100, 100, 86_400.0)


def _left(decision: Decision, policy: Policy) -> int:
    return next(p.remaining for p in decision.policies if p.policy == policy)


async def test_the_request_policy_is_charged_one_and_the_token_policy_the_estimate(
    make_backend: BackendFactory,
) -> None:
    limiter = RateLimiter(REQUESTS, TOKENS, backend=make_backend(), metered=[TOKENS])
    reservation = await limiter.reserve("user", 60)
    assert reservation
    assert reservation.charged == (1, 60)
    assert _left(reservation.decision, REQUESTS) == 9
    assert _left(reservation.decision, TOKENS) == 40
    # A refund: only the token policy changes.
    assert await limiter.settle(reservation, 25)
    peeked = await limiter.peek("user")
    assert (_left(peeked, REQUESTS), _left(peeked, TOKENS)) == (9, 75)
    # The rest charged, past the limit: debt. Every call is refused until it is paid.
    second = await limiter.reserve("user", 75)
    assert second
    assert await limiter.settle(second, 175)
    refused = await limiter.reserve("user", 0)
    assert not refused
    assert refused.decision.remaining == 0
    assert refused.decision.policy == TOKENS
    assert refused.decision.retry_after > 80_000
    assert not await limiter.settle(refused, 0)  # nothing was charged: nothing to settle
    assert not (await limiter.hit("user")).allowed


async def test_a_settle_at_the_estimate_needs_no_call_and_a_reservation_settles_once(
    make_backend: BackendFactory,
) -> None:
    limiter = RateLimiter(SlidingLog(5, 60.0), backend=make_backend())
    reservation = await limiter.reserve("k", 3)
    assert await limiter.settle(reservation, 3)
    with pytest.raises(RuntimeError, match="settled already"):
        await limiter.settle(reservation, 1)
    other = RateLimiter(SlidingLog(5, 60.0), backend=make_backend())
    with pytest.raises(ValueError, match="another limiter"):
        await other.settle(await limiter.reserve("k", 1), 1)
    assert (await limiter.peek("k")).remaining == 1


async def test_an_expired_reservation_keeps_its_estimate(make_backend: BackendFactory) -> None:
    clock = FakeClock()
    limiter = RateLimiter(REQUESTS, backend=make_backend(), clock=clock)
    reservation = await limiter.reserve("k", 4, ttl=5.0)
    clock.advance(5.5)
    assert not await limiter.settle(reservation, 0)
    assert reservation.settled
    assert (await limiter.peek("k")).remaining == 6


async def test_a_leasing_limiter_reserves_from_the_backend(make_backend: BackendFactory) -> None:
    backend = make_backend()
    if not callable(getattr(backend, "lease", None)):
        pytest.skip("no leases")
    leased = RateLimiter(REQUESTS, backend=backend, lease=Leasing(chunk=4, share=1.0))
    plain = RateLimiter(REQUESTS, backend=backend)
    assert (await leased.hit("k")).allowed  # a lease of 4 taken
    reservation = await leased.reserve("k", 5)
    assert reservation.decision.remaining == 1
    assert await leased.settle(reservation, 2)
    await leased.return_leases()
    assert (await plain.peek("k")).remaining == 7  # the hit, and 2 settled


async def test_bad_arguments_are_refused_clearly(make_backend: BackendFactory) -> None:
    backend = make_backend()
    with pytest.raises(ValueError, match="not one of the limiter's policies"):
        RateLimiter(REQUESTS, backend=backend, metered=[TOKENS])
    with pytest.raises(TypeError, match="list of policies"):
        RateLimiter(REQUESTS, backend=backend, metered=REQUESTS)  # type: ignore[arg-type]
    limiter = RateLimiter(REQUESTS, TOKENS, backend=backend, metered=[TOKENS])
    with pytest.raises(ValueError, match="estimate 101 can never be admitted"):
        await limiter.reserve("k", 101)
    with pytest.raises(ValueError, match="estimate must be >= 0"):
        await limiter.reserve("k", -1)
    with pytest.raises(TypeError, match="estimate must be an int"):
        await limiter.reserve("k", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl"):
        await limiter.reserve("k", 1, ttl=0)
    reservation = await limiter.reserve("k", 1)
    with pytest.raises(ValueError, match="actual must be between 0"):
        await limiter.settle(reservation, -1)
    with pytest.raises(TypeError, match="not a Reservation"):
        await limiter.settle("k", 1)  # type: ignore[arg-type]
    assert not reservation.settled  # a refused argument settles nothing


async def test_a_backend_that_cannot_reserve_is_named() -> None:
    with pytest.raises(TypeError, match="cannot reserve and settle"):
        await RateLimiter(REQUESTS, backend=DictBackend()).reserve("k", 1)


async def test_a_failed_backend_gives_the_failure_mode_and_nothing_to_settle() -> None:
    backend = RedisRateLimitBackend.from_url(f"redis://127.0.0.1:{free_port()}/0")
    limiter = RateLimiter(REQUESTS, backend=backend)
    reservation = await limiter.reserve("k", 3)
    assert reservation.allowed
    assert reservation.decision.source is Source.FAILED_OPEN
    assert reservation.at_us is None
    assert reservation.charged == (0,)
    assert not await limiter.settle(reservation, 1)


def test_the_sync_limiter_reserves_and_settles() -> None:
    limiter = SyncRateLimiter(
        REQUESTS, TOKENS, backend=SyncMemoryRateLimitBackend(), metered=[TOKENS]
    )
    reservation = limiter.reserve("k", 30)
    assert isinstance(reservation, Reservation)
    assert reservation
    assert limiter.settle(reservation, 130)
    assert not limiter.reserve("k", 1)
    assert "settled" in repr(reservation)


@pytest.mark.redis
async def test_a_stalled_redis_reserves_and_settles_within_the_budget(own_server: Server) -> None:
    # No socket timeout: only the limiter's budget can end the calls (its fast path's).
    client = aioredis.Redis.from_url(own_server.url)
    limiter = RateLimiter(REQUESTS, TOKENS, backend=RedisRateLimitBackend(client), budget=0.2)
    first = await limiter.reserve("k", 10)
    assert first.decision.source is Source.BACKEND
    os.kill(own_server.pid, signal.SIGSTOP)
    try:
        with anyio.fail_after(2):
            stalled = await limiter.reserve("k", 10)
            settled = await limiter.settle(first, 3)
    finally:
        os.kill(own_server.pid, signal.SIGCONT)
    assert stalled.decision.source is Source.FAILED_OPEN
    assert stalled.charged == (0, 0)  # nothing to settle
    assert not settled  # not known to be applied: the server may run it once it resumes
    recovered = await limiter.peek("k")
    assert recovered.source is Source.BACKEND
    # The first estimate, refunded or not; the stalled reservation, charged or not: each
    # call written runs at most once, whatever its caller was told.
    assert recovered.policies[1].remaining in {80, 87, 90, 97}
    await client.aclose()
