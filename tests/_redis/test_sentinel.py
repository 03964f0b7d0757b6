"""Redis Sentinel: redis-py's ``Sentinel(...).master_for(...)`` client under headway's backends.

Real ``redis-server --sentinel`` processes (a primary, a replica, three Sentinels on
free loopback ports, stopped by PID). A failover runs while a limiter and a lock
work: callers see decisions (failed-open ones while Redis is away) and
``BackendUnavailable`` only; both resume soon after the promotion; fences keep rising.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from unittest.mock import ANY

import pytest
from redis import asyncio as aioredis
from redis.asyncio.sentinel import Sentinel

from headway import (
    BackendUnavailable,
    Election,
    FixedWindow,
    Leader,
    Lock,
    LockNotAcquired,
    LockNotOwned,
    RateLimiter,
    ReadWriteLock,
    RedisLockBackend,
    RedisRateLimitBackend,
    Semaphore,
)
from tests.redis_observed import commands_run, connections_named
from tests.servers import RedisServers, SentinelGroup
from tests.windows import NO_ROLLOVER

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.redis,
    pytest.mark.slow,
]

TIMEOUT = 0.5  # the lock backend's round-trip bound, and the clients' socket timeouts
TTL = 1.0  # a lease the promoted replica copied but never saw released lapses within it
# A failover closes the clients' connections; reconnecting asks the Sentinels again.
RESUME = TTL + 2 * TIMEOUT + 1.0  # + margin for a shared, noisy VM


@pytest.fixture
def group(redis_servers: RedisServers) -> Iterator[SentinelGroup]:
    group = redis_servers.sentinel_group(replicas=1, sentinels=3)
    try:
        yield group
    finally:
        for server in [group.primary, *group.replicas, *group.sentinels]:
            redis_servers.stop(server)


@dataclass
class Backends:
    limits: RedisRateLimitBackend
    locks: RedisLockBackend


@pytest.fixture
async def backends(group: SentinelGroup) -> AsyncIterator[Backends]:
    """Both backends over one ``master_for`` client, as the docs configure them."""
    sentinel = Sentinel(group.addresses, socket_timeout=TIMEOUT)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(group.name, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT)
    both = Backends(RedisRateLimitBackend(client), RedisLockBackend(client, timeout=TIMEOUT))
    try:
        yield both
    finally:
        await both.limits.aclose()
        await both.locks.aclose()
        await client.aclose()
        for watcher in sentinel.sentinels:
            await watcher.aclose()
        # redis-py's Sentinel client can lose a socket to a Sentinel when a discovery
        # query is cancelled mid-connect (our budget cancels it during a failover). Collect
        # it here, its ResourceWarning ignored, rather than in whichever test runs next.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


async def test_the_backends_drive_a_sentinel_managed_client_over_their_own_connection(
    backends: Backends, group: SentinelGroup
) -> None:
    limits, locks = backends.limits, backends.locks
    limiter = RateLimiter(FixedWindow(limit=2, window=NO_ROLLOVER), backend=limits)
    assert [(await limiter.hit("k")).allowed for _ in range(3)] == [True, True, False]
    lease = await Lock(locks, "sentinel-steady", ttl=TTL).acquire()
    await Lock(locks, "sentinel-steady").release(lease)
    # Not the redis-py fallback (EVALSHA): the pipelined connection took the socket over.
    # One FCALL per hit, the lock's acquire and release (a call sent again with its
    # library failed first, and is not counted).
    ran = commands_run(group.primary.url)
    assert (ran["fcall"], ran["evalsha"]) == (3 + 2, 0)


async def test_an_election_over_a_sentinel_managed_client(backends: Backends) -> None:
    first = Election(backends.locks, "sentinel-leader", identity="node-1", ttl=5)
    second = Election(backends.locks, "sentinel-leader", identity="node-2", ttl=5)
    async with first.campaign() as term:
        with pytest.raises(LockNotAcquired):
            async with second.campaign(timeout=0):
                pass
        assert await second.leader() == Leader("node-1", term.term, ANY)
    async with second.campaign(timeout=5) as later:
        assert later.term > term.term
        assert (await first.leader()) == Leader("node-2", later.term, ANY)
    assert await first.leader() is None


async def test_read_write_locks_and_semaphores_over_a_sentinel_managed_client(
    backends: Backends,
) -> None:
    rw = ReadWriteLock(backends.locks, "sentinel-rw", ttl=5, timeout=5)
    readers = [await rw.read.acquire(timeout=0), await rw.read.acquire(timeout=0)]
    writer = asyncio.create_task(rw.write.acquire())
    for lease in readers:
        assert not writer.done()
        await rw.read.release(lease)
    handed = await writer  # woken by the last reader's release, over the Sentinel's primary
    assert handed.fence > max(lease.fence for lease in readers)
    await rw.write.release(handed)
    semaphore = Semaphore(backends.locks, "sentinel-pool", permits=2, ttl=5, timeout=0)
    permits = [await semaphore.acquire(), await semaphore.acquire()]
    with pytest.raises(LockNotAcquired):
        await semaphore.acquire()
    for lease in permits:
        await semaphore.release(lease)


async def test_a_demoted_server_answering_readonly_is_unavailable_and_dropped(
    redis_servers: RedisServers,
) -> None:
    # What a client still connected to a demoted primary sees: READONLY on every write.
    primary = redis_servers.start()
    replica = redis_servers.start("--replicaof", "127.0.0.1", str(primary.port))
    client = aioredis.Redis(port=replica.port, socket_timeout=TIMEOUT, client_name="demoted")
    limits = RedisRateLimitBackend(client)
    locks = RedisLockBackend(client, timeout=TIMEOUT)
    try:
        decision = await RateLimiter(FixedWindow(limit=5), backend=limits).hit("k")
        assert decision.failed  # the failure mode answered: no ReadOnlyError
        with pytest.raises(BackendUnavailable, match="demoted"):
            await Lock(locks, "demoted").acquire()
        # Both connections dropped, as the server sees: the next calls reconnect.
        assert [c["cmd"] for c in connections_named(replica.url, "demoted")] == []
    finally:
        await limits.aclose()
        await locks.aclose()
        await client.aclose()
        redis_servers.stop(replica)
        redis_servers.stop(primary)


@dataclass
class Run:
    """What the workers saw; ``since`` is when the promotion was seen (loop time)."""

    loop: asyncio.AbstractEventLoop
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    since: float | None = None
    decided: int = 0
    failed_open: int = 0
    fences: list[int] = field(default_factory=list)
    lock_errors: dict[str, int] = field(default_factory=dict)
    unexpected: list[BaseException] = field(default_factory=list)
    decided_after: asyncio.Event = field(default_factory=asyncio.Event)
    granted_after: asyncio.Event = field(default_factory=asyncio.Event)
    warm: asyncio.Event = field(default_factory=asyncio.Event)

    def promoted(self) -> bool:
        return self.since is not None and self.loop.time() > self.since


async def limit(run: Run, limiter: RateLimiter) -> None:
    while not run.stop.is_set():
        try:
            decision = await limiter.hit("sentinel-run")
        except Exception as exc:  # the assertion is that none arrive
            run.unexpected.append(exc)
            await asyncio.sleep(0.01)
            continue
        if decision.failed:
            run.failed_open += 1
            await asyncio.sleep(0.01)  # Redis is away: do not spin
        else:
            run.decided += 1
            if run.promoted():
                run.decided_after.set()
        if run.decided > 20 and len(run.fences) > 20:
            run.warm.set()


async def hold(run: Run, lock: Lock) -> None:
    while not run.stop.is_set():
        try:
            lease = await lock.acquire()
        except (BackendUnavailable, LockNotAcquired) as exc:
            run.lock_errors[type(exc).__name__] = run.lock_errors.get(type(exc).__name__, 0) + 1
            await asyncio.sleep(0.01)
            continue
        except Exception as exc:  # the assertion is that none arrive
            run.unexpected.append(exc)
            await asyncio.sleep(0.01)
            continue
        run.fences.append(lease.fence)
        if run.promoted():
            run.granted_after.set()
        try:
            await lock.release(lease)
        except (BackendUnavailable, LockNotOwned) as exc:  # the release may be lost
            run.lock_errors[type(exc).__name__] = run.lock_errors.get(type(exc).__name__, 0) + 1
        except Exception as exc:
            run.unexpected.append(exc)


async def promote(group: SentinelGroup, how: str) -> None:
    old = group.primary.port
    if how == "kill":
        group.primary.process.kill()  # SIGKILL, by PID: the Sentinels must notice
    else:
        await asyncio.to_thread(group.failover)
    while await asyncio.to_thread(group.primary_port) == old:
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("how", ["failover", "kill"])
async def test_a_failover_while_a_limiter_and_a_lock_run(
    group: SentinelGroup, backends: Backends, how: str
) -> None:
    limiter = RateLimiter(
        FixedWindow(limit=10**6, window=1), backend=backends.limits, budget=TIMEOUT
    )
    lock = Lock(backends.locks, "sentinel-run", ttl=TTL, timeout=TTL)
    run = Run(asyncio.get_running_loop())
    workers = [asyncio.create_task(limit(run, limiter)), asyncio.create_task(hold(run, lock))]
    try:
        await asyncio.wait_for(run.warm.wait(), 10)
        await asyncio.wait_for(promote(group, how), 30)
        run.since = run.loop.time()
        await asyncio.wait_for(run.decided_after.wait(), RESUME)
        await asyncio.wait_for(run.granted_after.wait(), RESUME)
    finally:
        run.stop.set()
        await asyncio.gather(*workers)
    assert run.unexpected == []
    assert all(a < b for a, b in zip(run.fences, run.fences[1:], strict=False)), run.fences
