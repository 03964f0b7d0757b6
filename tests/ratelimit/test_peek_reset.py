"""``peek`` reports without charging, and ``reset`` forgets, on every backend and algorithm
(what ``headway ratelimit`` relies on)."""

from __future__ import annotations

import pytest

from headway import FixedWindow, LeakyBucket, RateLimiter, SlidingCounter, SlidingLog, TokenBucket
from headway.ratelimit.policies import Policy
from tests.ratelimit.conftest import BackendFactory

pytestmark = pytest.mark.anyio

POLICIES: list[Policy] = [
    TokenBucket(10, 10, 60),
    LeakyBucket(10, 10, 60),
    FixedWindow(10, 60),
    SlidingLog(10, 60),
    SlidingCounter(10, 60),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
async def test_peek_charges_nothing_and_reset_forgets(
    make_backend: BackendFactory, policy: Policy
) -> None:
    limiter = RateLimiter(policy, backend=make_backend())
    for _ in range(3):
        assert await limiter.hit("user:42")
    seen = [(await limiter.peek("user:42", cost)).remaining for cost in (1, 1, 5, 1)]
    assert seen == [7, 7, 7, 7]
    assert (await limiter.hit("user:42")).remaining == 6  # the peeks took nothing
    await limiter.reset("user:42")
    assert (await limiter.peek("user:42")).remaining == 10
