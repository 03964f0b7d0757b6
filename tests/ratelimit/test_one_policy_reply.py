"""``decide_one.lua``'s answers: one integer where it fits, else ``decide.lua``'s list.

The differential tests hold every answer to the reference model; these pin the forms
themselves, and that they read alike on clients made with ``decode_responses=True``
(redis-py's path, ``own_connection=False``) and on headway's own connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import redis
from redis import asyncio as aioredis

from headway import (
    FixedWindow,
    RateLimiter,
    RedisRateLimitBackend,
    SlidingLog,
    SyncRateLimiter,
    SyncRedisRateLimitBackend,
    TokenBucket,
)
from headway._redis.sync_wire import SyncWire
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.backends.redis_scripts import decide_call, decide_script
from headway.ratelimit.decision import Decision, decision_from_decide, decision_from_reply
from headway.ratelimit.policies import Policy

HOUR = FixedWindow(2, 3600.0)


def test_an_integer_reads_as_the_list_it_stands_for() -> None:
    policy = [HOUR]  # limit 2: n = reset_us * 3 + remaining
    admitted = decision_from_decide(5_000 * 3 + 1, policy)
    assert admitted == decision_from_reply([1, 1, 1, 5_000, 0], policy)
    refused = decision_from_decide(-1 - (7_000 * 3 + 0), policy)
    assert refused == decision_from_reply([0, 0, 0, 7_000, 7_000], policy)
    assert decision_from_decide([0, 0, 0, 9, 4], policy) == decision_from_reply(
        [0, 0, 0, 9, 4], policy
    )


def _raw(client: redis.Redis, policy: Policy, key: str, peek: bool = False) -> object:
    policies = PolicySet.of([policy])
    with contextlib.closing(SyncWire(client)) as wire:
        keys, args = decide_call(key, policies, 1, peek, None)
        return wire.call(decide_script(policies), keys, args)


@pytest.mark.redis
def test_the_common_answers_are_one_integer(sync_redis_client: redis.Redis) -> None:
    assert isinstance(_raw(sync_redis_client, HOUR, "one-int"), int)  # admitted
    assert isinstance(_raw(sync_redis_client, HOUR, "one-int", peek=True), int)
    _raw(sync_redis_client, HOUR, "one-int")
    refused = _raw(sync_redis_client, HOUR, "one-int")  # a full window: retry = reset
    assert isinstance(refused, int)
    assert refused < 0
    log = SlidingLog(2, 3600.0)
    _raw(sync_redis_client, log, "one-log")
    _raw(sync_redis_client, log, "one-log")
    # A log's refusal waits for its oldest entry, its reset for its newest: the list.
    assert isinstance(_raw(sync_redis_client, log, "one-log"), list)


def _check(decisions: list[Decision]) -> None:
    first, second, third, log_refused = decisions
    assert [d.allowed for d in decisions] == [True, True, False, False]
    assert (first.remaining, second.remaining, third.remaining) == (1, 0, 0)
    assert 0 < third.retry_after == third.reset_after <= 3600
    assert 0 < log_refused.retry_after <= log_refused.reset_after <= 3600


@pytest.fixture
def decoded_sync(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.mark.redis
@pytest.mark.parametrize("own_connection", [False, True])
def test_sync_clients_with_decoded_replies_read_every_form(
    decoded_sync: redis.Redis, own_connection: bool
) -> None:
    backend = SyncRedisRateLimitBackend(decoded_sync, own_connection=own_connection)
    window = SyncRateLimiter(HOUR, backend=backend)
    log = SyncRateLimiter(SlidingLog(1, 3600.0), backend=backend)
    bucket = SyncRateLimiter(TokenBucket(1, 1, 3600.0), backend=backend)
    decisions = [window.hit("w") for _ in range(3)]
    log.hit("l")
    _check([*decisions, log.hit("l")])
    assert bucket.hit("b").allowed
    assert not bucket.hit("b").allowed
    backend.close()


@pytest.mark.redis
@pytest.mark.anyio
@pytest.mark.parametrize("own_connection", [False, True])
async def test_async_clients_with_decoded_replies_read_every_form(
    redis_url: str, own_connection: bool
) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    await client.flushdb()
    backend = RedisRateLimitBackend(client, own_connection=own_connection)
    window = RateLimiter(HOUR, backend=backend)
    log = RateLimiter(SlidingLog(1, 3600.0), backend=backend)
    decisions = [await window.hit("w") for _ in range(3)]
    await log.hit("l")
    _check([*decisions, await log.hit("l")])
    await backend.aclose()
    await client.aclose()
