"""Concurrency limits over every backend: slots counted, released whatever happens, expiring."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from redis import asyncio as aioredis

from headway import (
    Concurrency,
    ConcurrencyBackend,
    ConcurrencyLimiter,
    LockNotOwned,
    RedisRateLimitBackend,
    Source,
)
from headway._errors import ConcurrencyLimitExceeded
from headway.ratelimit.slots import slot_key

pytestmark = pytest.mark.anyio


async def _held(backend: ConcurrencyBackend, key: str, policy: Concurrency) -> int:
    """Slots stored for ``key`` right now: on Redis read without taking one; in memory,
    through the contract, by a probe slot taken and given back at once."""
    if isinstance(backend, RedisRateLimitBackend):
        return int(await backend.client.zcard(slot_key(key, policy)))
    probe = await backend.acquire_slot(key, policy, "probe")
    if not probe.granted:
        return probe.in_flight
    assert await backend.release_slot(key, policy, "probe")
    return probe.in_flight - 1


async def test_exactly_the_limit_is_admitted_among_concurrent_acquires(
    slot_backend: ConcurrencyBackend,
) -> None:
    # 300 calls at once can queue past the default 0.25 s budget on a loaded machine, and a
    # call over budget fails open: this test counts exclusion, so give the burst room.
    limiter = ConcurrencyLimiter(Concurrency(10), backend=slot_backend, budget=10)
    admissions = await asyncio.gather(*(limiter.acquire("hot") for _ in range(300)))
    granted = [a for a in admissions if a.allowed]
    assert len(granted) == 10
    # Each grant saw a different count: they were decided one after another.
    assert sorted(a.in_flight for a in granted) == list(range(1, 11))
    assert all(a.slot is not None and a.source is Source.BACKEND for a in granted)
    refused = [a for a in admissions if not a.allowed]
    assert all(a.in_flight == 10 and a.slot is None and a.remaining == 0 for a in refused)
    assert all(0 < a.retry_after <= 30 for a in refused)
    assert await _held(slot_backend, "hot", limiter.policy) == 10

    assert all(await asyncio.gather(*(limiter.release(a) for a in granted)))
    assert not any(await asyncio.gather(*(limiter.release(a) for a in refused)))
    assert await _held(slot_backend, "hot", limiter.policy) == 0
    again = await asyncio.gather(*(limiter.acquire("hot") for _ in range(30)))
    assert sum(a.allowed for a in again) == 10


async def test_hold_admits_the_limit_and_counts_every_refusal(
    slot_backend: ConcurrencyBackend,
) -> None:
    limiter = ConcurrencyLimiter(Concurrency(7), backend=slot_backend)
    gate, all_tried = asyncio.Event(), asyncio.Event()
    inside = 0
    refusals: list[ConcurrencyLimitExceeded] = []

    async def request() -> None:
        nonlocal inside
        try:
            async with limiter.hold("api") as admission:
                inside += 1
                tried()
                assert admission.allowed
                await gate.wait()
        except ConcurrencyLimitExceeded as exc:
            refusals.append(exc)
            tried()

    def tried() -> None:
        if inside + len(refusals) == 100:
            all_tried.set()

    tasks = [asyncio.create_task(request()) for _ in range(100)]
    await all_tried.wait()
    assert (inside, len(refusals)) == (7, 93)
    assert not any(exc.admission.allowed for exc in refusals)
    gate.set()
    await asyncio.gather(*tasks)
    assert await _held(slot_backend, "api", limiter.policy) == 0


async def test_limits_are_per_key_and_per_limit(slot_backend: ConcurrencyBackend) -> None:
    one = ConcurrencyLimiter(Concurrency(1), backend=slot_backend)
    two = ConcurrencyLimiter(Concurrency(2), backend=slot_backend)
    assert (await one.acquire("a")).allowed
    assert not (await one.acquire("a")).allowed
    assert (await one.acquire("b")).allowed
    assert (await two.acquire("a")).allowed  # its own slots


async def test_an_exception_releases_the_slot(slot_backend: ConcurrencyBackend) -> None:
    limiter = ConcurrencyLimiter(Concurrency(1), backend=slot_backend)
    with pytest.raises(ZeroDivisionError):
        async with limiter.hold("k"):
            _ = 1 / 0
    async with limiter.hold("k") as admission:
        assert admission.in_flight == 1


async def test_a_cancelled_block_releases_its_slot(slot_backend: ConcurrencyBackend) -> None:
    limiter = ConcurrencyLimiter(Concurrency(1), backend=slot_backend)
    entered = asyncio.Event()

    async def block() -> None:
        async with limiter.hold("k"):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(block())
    await entered.wait()
    assert not (await limiter.acquire("k")).allowed
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _held(slot_backend, "k", limiter.policy) == 0


async def test_a_block_cancelled_twice_still_releases(slot_backend: ConcurrencyBackend) -> None:
    limiter = ConcurrencyLimiter(Concurrency(1), backend=slot_backend)
    entered = asyncio.Event()

    async def block() -> None:
        async with limiter.hold("k"):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(block())
    await entered.wait()
    task.cancel()
    await asyncio.sleep(0)  # now releasing
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _held(slot_backend, "k", limiter.policy) == 0


@pytest.mark.parametrize("yields", range(8))
async def test_a_cancelled_acquire_strands_no_slot(
    slot_backend: ConcurrencyBackend, yields: int
) -> None:
    limiter = ConcurrencyLimiter(Concurrency(1), backend=slot_backend)
    await limiter.release(await limiter.acquire("warm"))  # a pooled connection: no connect
    task = asyncio.create_task(limiter.acquire("k"))
    for _ in range(yields):
        await asyncio.sleep(0)
    task.cancel()
    try:
        admission = await task
    except asyncio.CancelledError:
        assert await _held(slot_backend, "k", limiter.policy) == 0
    else:  # it completed before the cancellation landed: then we hold it
        assert await limiter.release(admission)


@pytest.mark.parametrize("yields", range(1, 8))
async def test_a_cancelled_release_still_releases(
    slot_backend: ConcurrencyBackend, yields: int
) -> None:
    limiter = ConcurrencyLimiter(Concurrency(1), backend=slot_backend)
    admission = await limiter.acquire("k")
    task = asyncio.create_task(limiter.release(admission))
    for _ in range(yields):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert await _held(slot_backend, "k", limiter.policy) == 0


async def test_a_dead_holders_slot_ends_with_its_lease(slot_backend: ConcurrencyBackend) -> None:
    limiter = ConcurrencyLimiter(Concurrency(1, ttl=0.2), backend=slot_backend)
    dead = await limiter.acquire("k")  # its holder never releases it
    refused = await limiter.acquire("k")
    assert not refused.allowed
    assert 0 < refused.retry_after <= 0.2
    await asyncio.sleep(0.3)
    assert (await limiter.acquire("k")).allowed
    assert dead.slot is not None
    assert not await limiter.release(dead)  # the lease ended: nothing of the new holder's freed
    with pytest.raises(LockNotOwned):
        await limiter.extend(dead.slot)
    assert not (await limiter.acquire("k")).allowed


async def test_hold_renews_a_block_that_outlasts_the_ttl(slot_backend: ConcurrencyBackend) -> None:
    limiter = ConcurrencyLimiter(Concurrency(1, ttl=0.15), backend=slot_backend)
    async with limiter.hold("long") as admission:
        await asyncio.sleep(0.5)
        assert not (await limiter.acquire("long")).allowed
        assert admission.slot is not None
    assert (await limiter.acquire("long")).allowed

    async with limiter.hold("short", renew=False):
        await asyncio.sleep(0.3)
        assert (await limiter.acquire("short")).allowed  # the lease ended meanwhile


async def test_extend_moves_the_deadline(slot_backend: ConcurrencyBackend) -> None:
    limiter = ConcurrencyLimiter(Concurrency(1, ttl=0.2), backend=slot_backend)
    admission = await limiter.acquire("k")
    assert admission.slot is not None
    longer = await limiter.extend(admission.slot, ttl=5.0)
    assert longer.ttl == 5.0
    assert longer.deadline > admission.slot.deadline
    await asyncio.sleep(0.3)
    assert not (await limiter.acquire("k")).allowed
    assert await limiter.release(longer)


def test_bad_arguments() -> None:
    for bad in (0, -1, 100_001):
        with pytest.raises(ValueError, match="limit"):
            Concurrency(bad)
    with pytest.raises(TypeError):
        Concurrency(1.5)  # type: ignore[arg-type]
    for ttl in (0, -1.0, float("nan"), 10**9):
        with pytest.raises(ValueError, match="ttl"):
            Concurrency(1, ttl=ttl)
    with pytest.raises(ValueError, match="on_error"):
        Concurrency(1, on_error="maybe")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ConcurrencyLimiter(object())  # type: ignore[arg-type]
    assert Concurrency(3).key_part == "cc3"


class _AskedPool(aioredis.BlockingConnectionPool):
    """A blocking pool that says when a command asks it for a connection (``asked``,
    once armed): redis-py's public ``get_connection``, wrapped."""

    asked: asyncio.Queue[None] | None = None

    async def get_connection(self, *args: Any, **options: Any) -> Any:
        if self.asked is not None:
            self.asked.put_nowait(None)
        return await super().get_connection(*args, **options)  # type: ignore[no-untyped-call]


@pytest.mark.redis
async def test_a_release_cancelled_before_it_was_sent_still_releases(redis_url: str) -> None:
    # Through redis-py, on one connection busy with a blocking call: the release
    # waits for it, and is cancelled before a byte of it was sent.
    pool = _AskedPool.from_url(redis_url, max_connections=1)
    client = aioredis.Redis.from_pool(pool)
    try:
        limiter = ConcurrencyLimiter(
            Concurrency(1), backend=RedisRateLimitBackend(client, own_connection=False), budget=5
        )
        admission = await limiter.acquire("k")
        asked = pool.asked = asyncio.Queue()
        busy = asyncio.ensure_future(client.blpop(["headway-test-nothing"], timeout=0.5))
        await asked.get()  # the blocking call took the connection before it yielded
        assert not pool.can_get_connection()  # the pool's one
        release = asyncio.create_task(limiter.release(admission))
        await asked.get()  # so the release waits for it
        assert not busy.done()
        assert not release.done()
        release.cancel()
        with pytest.raises(asyncio.CancelledError):
            await release
        await busy
        assert await client.zcard(slot_key("k", limiter.policy)) == 0
    finally:
        await client.aclose()


@pytest.mark.redis
@pytest.mark.parametrize("turns", [1, 2, 3])
async def test_a_release_cancelled_on_the_pipelined_connection_still_releases(
    redis_client: aioredis.Redis, turns: int
) -> None:
    # On headway's own connection a release is written before its first await, so a
    # cancellation at any later point cannot stop it.
    backend = RedisRateLimitBackend(redis_client)
    limiter = ConcurrencyLimiter(Concurrency(1), backend=backend, budget=5)
    try:
        admission = await limiter.acquire("k")
        assert backend.own_connection  # open since the acquire
        release = asyncio.create_task(limiter.release(admission))
        for _ in range(turns):
            await asyncio.sleep(0)
        release.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await release
        # Calls on one connection run in order: the release ran before this acquire.
        assert (await limiter.acquire("k")).allowed
    finally:
        await backend.aclose()
