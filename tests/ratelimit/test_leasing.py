"""Leased quota: chunks, their shrinking, give-backs, outages, forks, the middleware."""

from __future__ import annotations

import asyncio
import os
import signal
import warnings
from collections.abc import AsyncIterator

import httpx
import pytest
from redis import asyncio as aioredis

from headway import (
    FixedWindow,
    LeakyBucket,
    Leasing,
    MemoryRateLimitBackend,
    RateLimiter,
    RateLimitMiddleware,
    RedisRateLimitBackend,
    Rule,
    SlidingCounter,
    SlidingLog,
    Source,
    TokenBucket,
)
from headway._clock import FakeClock
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.lease_model import grant
from headway.ratelimit.policies import OnError, Policy
from tests.ratelimit.conftest import BackendFactory
from tests.servers import Server

pytestmark = pytest.mark.anyio


@pytest.fixture
async def own_client(own_server: Server) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(own_server.url)
    await client.flushall()  # our own throw-away server
    try:
        yield client
    finally:
        await client.aclose()


async def _scripts_run(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha", "eval")
    )


@pytest.mark.needs("lease")
async def test_leased_and_plain_limiters_admit_the_same(make_backend: BackendFactory) -> None:
    policy = FixedWindow(50, 3600.0)
    leased = RateLimiter(policy, backend=make_backend(), lease=Leasing(chunk=8))
    admitted = [await leased.hit("k") for _ in range(60)]
    assert sum(d.allowed for d in admitted) == 50
    assert [d.remaining for d in admitted[:50]] == list(range(49, -1, -1))
    assert all(d.source is Source.BACKEND for d in admitted)
    refused = admitted[-1]
    assert not refused.allowed
    assert 0 < refused.retry_after <= 3600


@pytest.mark.needs("lease")
async def test_two_limiters_share_one_quota_and_return_leases(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend()
    first = RateLimiter(FixedWindow(20, 3600.0), backend=backend, lease=Leasing(chunk=10, share=1))
    second = RateLimiter(FixedWindow(20, 3600.0), backend=backend, lease=Leasing(chunk=10, share=1))
    assert (await first.hit("k")).allowed  # leases 10, spends 1
    assert sum([(await second.hit("k")).allowed for _ in range(15)]) == 10
    await first.return_leases()  # its 9 unspent units go back
    assert sum([(await second.hit("k")).allowed for _ in range(15)]) == 9


@pytest.mark.needs("lease")
@pytest.mark.parametrize(
    "policy",
    [
        FixedWindow(20, 3600.0),
        SlidingCounter(20, 3600.0),
        TokenBucket(20, 1, 3600.0),
        LeakyBucket(20, 1, 3600.0),
    ],
    ids=lambda p: p.name,
)
async def test_every_leased_algorithm_takes_unspent_units_back(
    make_backend: BackendFactory, policy: Policy
) -> None:
    backend = make_backend()
    leased = RateLimiter(policy, backend=backend, lease=Leasing(chunk=20, share=1))
    plain = RateLimiter(policy, backend=backend)  # the same states: one quota
    assert (await leased.hit("k")).allowed  # leases all 20 (no hold gap: none would be left)
    assert (await plain.peek("k")).remaining == 0
    await leased.return_leases()  # 19 unspent units go back
    assert (await plain.peek("k")).remaining == 19


@pytest.mark.needs("lease")
async def test_reset_drops_the_lease_too(make_backend: BackendFactory) -> None:
    limiter = RateLimiter(
        FixedWindow(10, 3600.0), backend=make_backend(), lease=Leasing(chunk=10, share=1)
    )
    assert (await limiter.hit("k")).allowed  # leases all 10
    await limiter.reset("k")
    assert sum([(await limiter.hit("k")).allowed for _ in range(15)]) == 10


@pytest.mark.needs("lease")
async def test_a_held_lease_goes_back_after_hold(make_backend: BackendFactory) -> None:
    backend = make_backend()
    idle = RateLimiter(FixedWindow(10, 3600.0), backend=backend, lease=Leasing(10, 1, hold=0.05))
    busy = RateLimiter(FixedWindow(10, 3600.0), backend=backend, lease=Leasing(10, 1))
    assert (await idle.hit("k")).allowed
    assert not (await busy.hit("k")).allowed  # every unit sits in the idle one's lease
    leases = idle._leases
    assert leases is not None
    ledger = leases.ledger
    for _ in range(200):  # the hold time is a timer: wait for it, bounded
        if not ledger.held and not leases.returns:
            break
        await asyncio.sleep(0.01)
    assert sum([(await busy.hit("k")).allowed for _ in range(12)]) == 9


async def test_leases_shrink_as_the_quota_runs_out(own_client: aioredis.Redis) -> None:
    leasing = Leasing(chunk=50, share=0.25, hold=30)
    limiter = RateLimiter(
        FixedWindow(100, 3600.0), backend=RedisRateLimitBackend(own_client), lease=leasing
    )
    expected, remaining = 0, 100
    while remaining:  # one call per lease: a quarter of what remains, at least one unit
        remaining -= grant(remaining, 1, leasing.chunk, leasing.permille)
        expected += 1
    assert (
        await limiter.hit("warm")
    ).allowed  # the library is loaded (Function not found, then loaded)
    before = await _scripts_run(own_client)
    assert all([(await limiter.hit("k")).allowed for _ in range(100)])
    assert await _scripts_run(own_client) - before == expected
    assert expected < 30  # and the last units cost a call each
    assert not (await limiter.hit("k")).allowed


async def test_a_hot_key_costs_one_call_per_chunk(own_client: aioredis.Redis) -> None:
    limiter = RateLimiter(
        TokenBucket(10**8, 10**6), backend=RedisRateLimitBackend(own_client), lease=Leasing()
    )
    assert (await limiter.hit("warm")).allowed
    before = await _scripts_run(own_client)
    assert all([(await limiter.hit("k")).allowed for _ in range(1000)])
    calls = await _scripts_run(own_client) - before
    assert calls <= 1000 // Leasing().chunk + 2, calls


async def test_lease_calls_send_their_own_cost_and_leasing(own_client: aioredis.Redis) -> None:
    """The arguments packed once per (cost, Leasing) on one policy set stay each call's own."""
    backend = RedisRateLimitBackend(own_client)
    policies = PolicySet([FixedWindow(1000, 3600.0)])
    small, large = Leasing(chunk=1, share=1.0), Leasing(chunk=7, share=1.0)
    granted = []
    for index, (cost, leasing) in enumerate([(1, small), (3, small), (2, large), (3, small)]):
        await backend.lease(f"k{index}", policies, cost, leasing)  # a fresh key each
        reply = await backend.lease(f"k{index}", policies, cost, leasing)
        granted.append((reply[0], reply[2]))  # units granted, remaining after them
    # At least the cost, at most the chunk when it is larger: two leases per key.
    assert granted == [(1, 998), (3, 994), (7, 986), (3, 994)]


def test_sliding_logs_and_backends_without_leases_are_refused() -> None:
    with pytest.raises(ValueError, match="sliding log"):
        RateLimiter(FixedWindow(5), SlidingLog(5), lease=Leasing())
    with pytest.raises(ValueError, match="sliding log"):
        Rule(SlidingLog(5), lease=Leasing())

    class Plain(MemoryRateLimitBackend):
        lease = None  # type: ignore[assignment]

    with pytest.raises(TypeError, match="cannot lease"):
        RateLimiter(FixedWindow(5), backend=Plain(), lease=Leasing())
    for bad in ({"chunk": 0}, {"share": 0.0}, {"hold": 0.0}):
        with pytest.raises(ValueError, match="Leasing"):
            Leasing(**bad)


@pytest.mark.parametrize("on_error", ["allow", "deny"])
async def test_a_stalled_redis_spends_the_lease_then_fails_as_the_policy_says(
    own_server: Server, on_error: OnError
) -> None:
    client = aioredis.Redis.from_url(own_server.url)
    policy = FixedWindow(100, 3600.0, on_error=on_error)
    limiter = RateLimiter(
        policy, backend=RedisRateLimitBackend(client), budget=0.2, lease=Leasing(10, 1, hold=30)
    )
    assert (await limiter.hit("k")).allowed
    os.kill(own_server.pid, signal.SIGSTOP)
    try:
        local = [await limiter.hit("k") for _ in range(9)]
        after = await limiter.hit("k")
    finally:
        os.kill(own_server.pid, signal.SIGCONT)
    assert all(d.allowed and d.source is Source.BACKEND for d in local)
    assert after.failed
    assert after.allowed is (on_error == "allow")
    await client.aclose()


async def test_a_forked_child_never_spends_its_parents_lease() -> None:
    limiter = RateLimiter(FixedWindow(10, 3600.0), lease=Leasing(chunk=10, share=1))
    assert (await limiter.hit("k")).allowed
    leases = limiter._leases
    assert leases is not None
    ledger = leases.ledger
    read, write = os.pipe()
    with warnings.catch_warnings():  # fork() in a process with threads: the child only reads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: its copy of the lease must be gone
        spent = ledger.spend("k", leases.now_us(), 1, False)
        os.write(write, b"spent" if spent is not None else b"none")
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 16) == b"none"
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sum([(await limiter.hit("k")).allowed for _ in range(10)]) == 9  # the parent's


async def test_the_middleware_leases_and_speaks_the_headers() -> None:
    async def app(scope: object, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    rule = Rule(FixedWindow(5, 3600.0), name="api", lease=Leasing(chunk=4))
    guarded = RateLimitMiddleware(app, rules=[rule], backend=MemoryRateLimitBackend())
    transport = httpx.ASGITransport(app=guarded)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answers = [await client.get("/") for _ in range(6)]
    assert [r.status_code for r in answers] == [200] * 5 + [429]
    assert [r.headers["RateLimit"] for r in answers[:5]] == [
        f'"api";r={left};t={answers[i].headers["RateLimit"].split("t=")[1]}'
        for i, left in enumerate(range(4, -1, -1))
    ]
    assert answers[5].headers["Retry-After"] == answers[5].headers["RateLimit"].split("t=")[1]


@pytest.mark.parametrize(
    ("policy", "later"),
    [
        (FixedWindow(2, 1.0), 0.5),  # the window the units were charged to has ended
        (SlidingCounter(2, 1.0), 0.5),
        (TokenBucket(2, 1, 1.0), 2.5),  # the bucket refilled the slot of the unit left
        (LeakyBucket(2, 1, 1.0), 2.5),
    ],
)
async def test_a_unit_is_never_spent_past_its_end(policy: Policy, later: float) -> None:
    clock = FakeClock(1000.5)
    leasing = Leasing(chunk=2, share=1, hold=10)
    leased = RateLimiter(policy, backend=MemoryRateLimitBackend(clock), clock=clock, lease=leasing)
    plain = RateLimiter(policy, backend=MemoryRateLimitBackend(clock), clock=clock)
    assert (await leased.hit("k")).allowed  # leases 2 units, spends 1
    assert (await plain.hit("k")).allowed
    clock.now += later
    # The unit left is no longer spendable: a new lease gives it back and takes more,
    # admitting what the plain limiter admits (a unit spent late would be one more).
    expected = [(await plain.hit("k")).allowed for _ in range(3)]
    assert [(await leased.hit("k")).allowed for _ in range(3)] == expected
    assert expected[0]


async def test_the_decorator_and_the_dependency_lease_too() -> None:
    from fastapi import Depends, FastAPI

    from headway import RateLimitDependency, rate_limit
    from tests.ratelimit.apps import client

    app = FastAPI()
    backend = MemoryRateLimitBackend()
    limit = RateLimitDependency(FixedWindow(3, 3600.0), backend=backend, lease=Leasing(2))

    @app.get("/decorated")
    @rate_limit(FixedWindow(3, 3600.0), backend=backend, lease=Leasing(chunk=2))
    async def decorated() -> dict[str, str]:
        return {}

    @app.get("/depends", dependencies=[Depends(limit)])
    async def depends() -> dict[str, str]:
        return {}

    async with client(app) as http:
        for path in ("/decorated", "/depends"):
            codes = [(await http.get(path)).status_code for _ in range(4)]
            assert codes == [200, 200, 200, 429], path
    guards = [decorated.guard, limit.guard]  # type: ignore[attr-defined]
    assert [g.rules[0].limiter.lease for g in guards] == [Leasing(2), Leasing(2)]
