"""The Redis paths on uvloop, the loop ``uvicorn[standard]`` and ``fastapi[standard]`` run.

headway drives its Redis socket itself (``_redis.connection`` takes the transport over from
redis-py with ``set_protocol``), which is where event-loop implementations
differ. ``tests/_redis/test_wire.py`` runs on both loops; these run the limiter and
the lock end to end on uvloop.
"""

from __future__ import annotations

import asyncio

import pytest
from redis import asyncio as aioredis

from headway import FixedWindow, Lock, RateLimiter, RedisLockBackend, RedisRateLimitBackend
from tests.redis_observed import commands_run, connections_named
from tests.windows import NO_ROLLOVER

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"use_uvloop": True})


async def test_the_loop_is_uvloop() -> None:
    import uvloop

    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)


async def test_concurrent_hits_are_counted_exactly(
    redis_client: aioredis.Redis, redis_url: str
) -> None:
    named = aioredis.Redis.from_url(redis_url, client_name="headway-uvloop")
    backend = RedisRateLimitBackend(named)
    assert backend.own_connection  # headway's own connection, not redis-py's
    limiter = RateLimiter(FixedWindow(300, NO_ROLLOVER), backend=backend)
    try:
        # One hit first: headway's connection opened (and the script's library loaded),
        # so the thousand are written at once, the limiter's fast path.
        assert (await limiter.hit("another")).allowed
        before = commands_run(redis_url)
        decisions = await asyncio.gather(*(limiter.hit("k") for _ in range(1000)))
        assert sum(d.allowed for d in decisions) == 300
        # As the server saw them: one FCALL each, none through redis-py (EVALSHA), all
        # on one connection.
        ran = commands_run(redis_url) - before
        assert (ran["fcall"], ran["evalsha"]) == (1000, 0)
        assert [c["cmd"] for c in connections_named(redis_url, "headway-uvloop")] == ["fcall"]
    finally:
        await backend.aclose()
        await named.aclose()


async def test_contended_lock_excludes_and_hands_over(redis_client: aioredis.Redis) -> None:
    backend = RedisLockBackend(redis_client)
    lock = Lock(backend, "counter", ttl=5.0, timeout=30.0)
    count, inside, fences = 0, 0, []

    async def worker() -> None:
        nonlocal count, inside
        for _ in range(25):
            async with lock.hold() as lease:
                inside += 1
                assert inside == 1
                fences.append(lease.fence)
                value = count
                await asyncio.sleep(0)  # let the others queue up behind us
                count = value + 1
                inside -= 1

    await asyncio.gather(*(worker() for _ in range(8)))
    assert count == 200
    assert len(set(fences)) == 200  # each grant a fence of its own ...
    assert fences == sorted(fences)  # ... newer than the last
    await backend.aclose()
