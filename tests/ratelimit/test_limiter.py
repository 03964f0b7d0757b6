"""The standalone limiter over every backend: semantics that hold on each."""

from __future__ import annotations

import asyncio

import pytest

from headway import (
    Decision,
    FixedWindow,
    LeakyBucket,
    RateLimiter,
    SlidingCounter,
    SlidingLog,
    Source,
    SyncRateLimiter,
    TokenBucket,
)
from headway._clock import within
from headway.ratelimit.policies import Policy
from tests.ratelimit.conftest import BackendFactory
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio

ALL: list[Policy] = [
    TokenBucket(5, 1, 10.0),
    LeakyBucket(5, 1, 10.0),
    FixedWindow(5, NO_ROLLOVER),
    SlidingLog(5, 60.0),
    SlidingCounter(5, 60.0),
]


@pytest.mark.parametrize("policy", ALL, ids=lambda p: p.name)
async def test_admits_the_limit_then_rejects(make_backend: BackendFactory, policy: Policy) -> None:
    limiter = RateLimiter(policy, backend=make_backend())
    decisions = [await limiter.hit("user") for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [d.remaining for d in decisions] == [4, 3, 2, 1, 0, 0]
    assert all(d.limit == 5 and d.policy == policy for d in decisions)
    assert all(d.source is Source.BACKEND for d in decisions)
    denied = decisions[-1]
    assert not denied
    # The sliding counter's previous window weighs until the end of the next one.
    bound = NO_ROLLOVER if isinstance(policy, FixedWindow) else 120
    assert 0 < denied.retry_after <= denied.reset_after <= bound
    assert (await limiter.hit("someone else")).allowed


@pytest.mark.parametrize("policy", ALL, ids=lambda p: p.name)
async def test_peek_never_charges(make_backend: BackendFactory, policy: Policy) -> None:
    limiter = RateLimiter(policy, backend=make_backend())
    for _ in range(10):
        peeked = await limiter.peek("k", cost=5)
        assert peeked.allowed
        assert peeked.remaining == 5
    assert (await limiter.hit("k", cost=5)).remaining == 0
    assert not (await limiter.peek("k")).allowed


@pytest.mark.parametrize("policy", ALL, ids=lambda p: p.name)
async def test_cost_is_charged_whole(make_backend: BackendFactory, policy: Policy) -> None:
    limiter = RateLimiter(policy, backend=make_backend())
    assert (await limiter.hit("k", cost=3)).remaining == 2
    rejected = await limiter.hit("k", cost=3)
    assert not rejected.allowed
    assert rejected.remaining == 2  # a rejected request charges nothing
    assert (await limiter.hit("k", cost=2)).remaining == 0


async def test_several_policies_are_all_or_nothing(make_backend: BackendFactory) -> None:
    burst, hourly = FixedWindow(3, NO_ROLLOVER), SlidingLog(4, 3600.0)
    limiter = RateLimiter(burst, hourly, backend=make_backend())
    assert (await limiter.hit("k", cost=2)).allowed
    rejected = await limiter.hit("k", cost=2)  # burst has 1 left: neither is charged
    assert not rejected.allowed
    assert rejected.policy == burst
    parts = {p.policy: p for p in rejected.policies}
    assert parts[burst].remaining == 1
    assert not parts[burst].allowed
    assert parts[hourly].remaining == 2
    assert parts[hourly].allowed
    admitted = await limiter.hit("k", cost=1)
    assert admitted.allowed
    assert [p.remaining for p in admitted.policies] == [0, 1]


async def test_reset_forgets_the_key(make_backend: BackendFactory) -> None:
    limiter = RateLimiter(*ALL, backend=make_backend())
    assert (await limiter.hit("k", cost=5)).allowed
    assert not (await limiter.hit("k")).allowed
    await limiter.reset("k")
    assert (await limiter.hit("k", cost=5)).allowed


async def test_wait_is_admitted_after_the_refill(make_backend: BackendFactory) -> None:
    limiter = RateLimiter(TokenBucket(2, 1, 0.05), backend=make_backend())
    await limiter.hit("k", cost=2)
    decision = await limiter.wait("k", timeout=5)
    assert decision.allowed


async def test_wait_gives_up_at_once_when_the_timeout_is_too_short(
    make_backend: BackendFactory,
) -> None:
    # A day-long window: an hour boundary once reset the window mid-test.
    limiter = RateLimiter(FixedWindow(1, NO_ROLLOVER), backend=make_backend())
    await limiter.hit("k")
    decision = await limiter.wait("k", timeout=0.5)
    assert not decision.allowed
    assert decision.retry_after > 0.5


async def test_concurrent_waits_on_one_key_take_turns_in_call_order(
    make_backend: BackendFactory,
) -> None:
    """Ten waits on an empty bucket refilled every 20 ms: admitted in the order they were
    called (only the first of the line asks the backend), and one cancelled on the way
    gives its turn to the next."""
    limiter = RateLimiter(TokenBucket(1, 1, 0.02), backend=make_backend())
    assert (await limiter.hit("k")).allowed
    order: list[int] = []

    async def one(n: int) -> None:
        decision = await limiter.wait("k", timeout=5)
        assert decision.allowed
        order.append(n)

    tasks = [asyncio.ensure_future(one(n)) for n in range(10)]
    await asyncio.sleep(0)  # every wait has joined the line
    tasks[4].cancel()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert order == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert limiter._lines.lines == {}
    assert limiter._lines.waiting == 0


def test_bad_arguments_are_rejected_before_anything_is_sent() -> None:
    limiter = SyncRateLimiter(FixedWindow(5), TokenBucket(3, 1))
    with pytest.raises(ValueError, match="can never be admitted"):
        limiter.hit("k", cost=4)
    with pytest.raises(ValueError, match=">= 1"):
        limiter.hit("k", cost=0)
    with pytest.raises(TypeError):
        limiter.hit("k", cost=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one policy"):
        SyncRateLimiter()
    with pytest.raises(ValueError, match="same parameters"):
        SyncRateLimiter(FixedWindow(5), FixedWindow(5))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FixedWindow(0), "between 1 and"),
        (lambda: FixedWindow(5, 0.0001), "between 0.001"),
        (lambda: FixedWindow(5, float("nan")), "between 0.001"),
        (lambda: SlidingLog(10**6), "between 1 and"),
        (lambda: TokenBucket(10, 0), "between 1 and"),
        (lambda: LeakyBucket(10**9, 1, 3600.0 * 24 * 300), "exactly"),
        (lambda: SlidingCounter(5, on_error="maybe"), "on_error"),  # type: ignore[arg-type]
    ],
)
def test_policies_validate_their_parameters(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_sub_second_windows_and_rounded_refill() -> None:
    assert FixedWindow(10, 0.25).window_us == 250_000
    assert TokenBucket(10, 3).interval_us == 333_334  # rounded up: never refills faster
    assert TokenBucket(1000, 1000, 3600.0).interval_us == 3_600_000


def test_sync_limiter_shares_the_semantics() -> None:
    limiter = SyncRateLimiter(SlidingLog(2, 60.0), cache_blocked=True)
    assert [limiter.hit("k").allowed for _ in range(3)] == [True, True, False]
    cached = limiter.hit("k")
    assert isinstance(cached, Decision)
    assert cached.source is Source.CACHE
    assert not cached.allowed
    limiter.reset("k")
    assert limiter.hit("k").allowed


async def test_within_times_out_but_keeps_an_outside_cancellation() -> None:
    assert await within(1.0, asyncio.sleep(0, "done")) == "done"
    with pytest.raises(TimeoutError, match=r"no answer within 0\.01 s"):
        await within(0.01, asyncio.Event().wait())

    async def times_out_itself() -> None:
        raise TimeoutError("its own")

    with pytest.raises(TimeoutError, match="its own"):  # not ours: passed on as it is
        await within(1.0, times_out_itself())

    task = asyncio.create_task(within(10.0, asyncio.Event().wait()))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # A timer that fired leaves nothing behind: the task goes on undisturbed.
    with pytest.raises(TimeoutError):
        await within(0.01, asyncio.Event().wait())
    await asyncio.sleep(0.02)
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0
