"""What only the Redis backend can show: keys, round trips, outages, Cluster, sync API."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from redis import asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from headway import (
    BackendUnavailable,
    Lock,
    LockNotAcquired,
    LockNotOwned,
    RedisLockBackend,
    SyncLock,
    SyncRedisLockBackend,
)
from headway.lock.backends.redis.keys import (
    ACQUIRE,
    LEAVE,
    RELEASE,
    acquire_call,
    leave_call,
    lock_keys,
    release_call,
)
from headway.lock.flow import Attempt, Try, waiter_id
from tests.servers import RedisServers, free_port

pytestmark = pytest.mark.anyio

# Commands a client might send on its own (scripts run GET, SET, ZRANGE... inside).
TOP_LEVEL = {
    "cmdstat_config|resetstat", "cmdstat_evalsha", "cmdstat_eval", "cmdstat_ping",
    "cmdstat_subscribe", "cmdstat_unsubscribe", "cmdstat_client|setinfo", "cmdstat_hello",
    "cmdstat_select", "cmdstat_script|load", "cmdstat_info",
}  # fmt: skip


@pytest.fixture
async def backend(redis_client: aioredis.Redis) -> AsyncIterator[RedisLockBackend]:
    b = RedisLockBackend(redis_client)
    yield b
    await b.aclose()


async def test_every_key_has_a_ttl(backend: RedisLockBackend, redis_client: aioredis.Redis) -> None:
    lock = Lock(backend, "ttl-check", ttl=30)
    holder = await lock.acquire()
    # Another client's waiter queues in Redis at once (one of ours would ride on the
    # holder's release instead).
    other = Lock(RedisLockBackend(redis_client), "ttl-check", ttl=30)
    waiter = asyncio.create_task(other.acquire(timeout=5))
    keys = lock_keys("ttl-check")
    async with asyncio.timeout(5):
        while not await redis_client.exists(keys.queue):
            await asyncio.sleep(0.01)
    found = [key async for key in redis_client.scan_iter("headway:*")]
    assert {k.decode() for k in found} == {keys.owner, keys.fence, keys.queue, keys.places}
    for key in found:
        assert await redis_client.pttl(key) > 0, key
    await lock.release(holder)
    await other.release(await waiter)


async def test_uncontended_cycle_is_two_round_trips(redis_servers: RedisServers) -> None:
    server = redis_servers.start()
    client = aioredis.Redis(port=server.port)
    lock = Lock(RedisLockBackend(client), "rt", ttl=5)
    await lock.release(await lock.acquire())  # scripts cached, connection open
    await client.config_resetstat()
    for _ in range(100):
        await lock.release(await lock.acquire())
    calls = {k: v["calls"] for k, v in (await client.info("commandstats")).items()}
    # Commands run inside scripts are counted too; the client sent only EVALSHAs.
    top_level = {k: n for k, n in calls.items() if k in TOP_LEVEL}
    assert top_level == {"cmdstat_config|resetstat": 1, "cmdstat_evalsha": 200}
    await client.aclose()
    redis_servers.stop(server)


async def test_concurrent_locks_share_pipelined_round_trips(
    backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    locks = [Lock(backend, f"order/{i}", ttl=5) for i in range(200)]
    leases = await asyncio.gather(*(lock.acquire(timeout=0) for lock in locks))
    wire = backend._wires.wire()
    assert wire.requests == 200
    assert wire.writes <= 20  # coalesced, not one write each
    for lease in leases:  # every grant is real, and each lock has its own
        assert await redis_client.get(lock_keys(lease.resource).owner) == lease.token.encode()
    await asyncio.gather(*(lock.release(lease) for lock, lease in zip(locks, leases, strict=True)))
    assert not [k async for k in redis_client.scan_iter("headway:{lock:*}:owner")]
    # Contended locks still exclude: each is held, so a second round grants nothing.
    again = await asyncio.gather(*(lock.acquire(timeout=0) for lock in locks))
    refused = await asyncio.gather(
        *(lock.acquire(timeout=0) for lock in locks), return_exceptions=True
    )
    assert all(isinstance(r, LockNotAcquired) for r in refused)
    await asyncio.gather(*(lock.release(lease) for lock, lease in zip(locks, again, strict=True)))


@pytest.mark.parametrize("name", ["", "{a}:b", "x" * 1_000_000, "\u2603\x00", "headway:{lock:r}"])
async def test_hostile_names_work_and_stay_in_bounded_keys(
    backend: RedisLockBackend, redis_client: aioredis.Redis, name: str
) -> None:
    lock = Lock(backend, name, ttl=5)
    lease = await lock.acquire(timeout=0)
    assert lease.resource == name
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0)
    async for key in redis_client.scan_iter("*"):
        assert len(key) < 100
    await lock.release(lease)


async def test_noscript_after_script_flush_is_recovered(
    backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    lock = Lock(backend, "r", ttl=5)
    lease = await lock.acquire()
    await redis_client.script_flush()
    lease = await lock.extend(lease)
    await redis_client.script_flush()
    await lock.release(lease)
    await redis_client.script_flush()
    await lock.release(await lock.acquire())


async def test_a_retried_release_is_not_reported_as_lost(
    backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    # redis-py retries a command whose reply was lost: the release script runs twice,
    # the second time possibly after another holder took the lock.
    lock = Lock(backend, "r", ttl=5)
    lease = await lock.acquire()
    keys, args = release_call("r", lease.token)
    assert await RELEASE.run(redis_client, keys, args) == 1
    successor = await lock.acquire(timeout=0)
    assert await RELEASE.run(redis_client, keys, args) == 1  # the retry: still "released"
    with pytest.raises(LockNotAcquired):  # ... and the successor was not touched
        await lock.acquire(timeout=0)
    with pytest.raises(LockNotOwned):  # a second release *call* is still refused
        await lock.release(lease)
    await lock.release(successor)
    # A lease that lapsed without being released is still reported.
    stale = await lock.acquire(ttl=0.05)
    await asyncio.sleep(0.15)
    with pytest.raises(LockNotOwned):
        await lock.release(stale)


async def test_fence_survives_lost_counter(
    backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    lock = Lock(backend, "r", ttl=5)
    first = await lock.acquire()
    await lock.release(first)
    await redis_client.flushdb()  # a restart without persistence loses the counter
    second = await lock.acquire()
    assert second.fence > first.fence
    await lock.release(second)


async def test_redis_down_raises_backend_unavailable_within_timeout() -> None:
    backend = RedisLockBackend.from_url(f"redis://127.0.0.1:{free_port()}", timeout=0.5)
    lock = Lock(backend, "r")
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as caught:
        await lock.acquire(timeout=0)
    assert caught.value.backend == "redis"
    assert time.monotonic() - started < 0.5 + 1.0
    await backend.client.aclose()


async def test_redis_stalled_raises_backend_unavailable_within_timeout(
    redis_servers: RedisServers,
) -> None:
    server = redis_servers.start()
    backend = RedisLockBackend.from_url(server.url, timeout=0.3)
    lock = Lock(backend, "r")
    await lock.release(await lock.acquire())
    pause = redis.Redis(port=server.port)
    pause.client_pause(2000)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable):
        await lock.acquire(timeout=0)
    assert time.monotonic() - started < 0.3 + 1.0
    pause.client_unpause()
    pause.close()
    await backend.client.aclose()
    redis_servers.stop(server)


# --- the sync API: the same scripts and flow behind blocking calls ------------


@pytest.fixture
def sync_backend(sync_redis_client: redis.Redis) -> Iterator[SyncRedisLockBackend]:
    backend = SyncRedisLockBackend(sync_redis_client)
    yield backend
    backend.close()


@pytest.fixture
def sync_lock(sync_backend: SyncRedisLockBackend) -> SyncLock:
    return SyncLock(sync_backend, "sync", ttl=5)


def test_sync_acquire_extend_release(sync_lock: SyncLock) -> None:
    lease = sync_lock.acquire(timeout=0)
    with pytest.raises(LockNotAcquired):
        sync_lock.acquire(timeout=0)
    lease = sync_lock.extend(lease, ttl=10)
    sync_lock.release(lease)
    with pytest.raises(LockNotOwned):
        sync_lock.release(lease)


def test_sync_threads_exclude_each_other_and_are_woken(sync_lock: SyncLock) -> None:
    counter = 0
    fences: list[int] = []

    def worker() -> None:
        nonlocal counter
        for _ in range(20):
            lease = sync_lock.acquire(timeout=30)
            value = counter
            time.sleep(0.0005)  # widen the race window: only the lock protects it
            counter = value + 1
            fences.append(lease.fence)
            sync_lock.release(lease)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter == 120
    assert fences == sorted(fences)


def test_sync_hold_renews(sync_backend: SyncRedisLockBackend) -> None:
    lock = SyncLock(sync_backend, "sync-hold", ttl=0.6)
    with lock.hold(renew_every=0.1):
        time.sleep(1.5)  # 2.5 TTLs: only renewals keep it
        with pytest.raises(LockNotAcquired):
            lock.acquire(timeout=0)
    lock.release(lock.acquire(timeout=0))


def test_sync_riders_take_one_script_per_grant_in_fifo_order(
    redis_servers: RedisServers,
) -> None:
    server = redis_servers.start()
    client = redis.Redis(port=server.port)
    backend = SyncRedisLockBackend(client)
    lock = SyncLock(backend, "ride", ttl=10, timeout=30)
    lock.release(lock.acquire())  # scripts cached, a connection open
    grants: list[int] = []
    inside = 0
    guard = threading.Lock()

    def worker(n: int) -> None:
        nonlocal inside
        for _ in range(30):
            lease = lock.acquire()
            with guard:
                inside += 1
                assert inside == 1
            grants.append(n)
            time.sleep(0.0005)  # the others ask meanwhile: they ride
            with guard:
                inside -= 1
            lock.release(lease)

    client.config_resetstat()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    calls = {k: v["calls"] for k, v in client.info("commandstats").items()}
    assert sorted(grants.count(n) for n in range(6)) == [30] * 6
    # Every acquire but the first few rides on a release: about one script per grant
    # (without riding, two: the release and the releasing thread's next attempt).
    assert calls["cmdstat_evalsha"] <= len(grants) * 1.2 + 12
    # FIFO: once all six are in, each grant goes to the thread that waited longest.
    assert all(len(set(grants[i : i + 6])) == 6 for i in range(12, len(grants) - 12, 6))
    backend.close()
    client.close()
    redis_servers.stop(server)


def test_a_sync_rider_that_gives_up_during_the_release_leaves_after_it(
    sync_backend: SyncRedisLockBackend, sync_redis_client: redis.Redis
) -> None:
    # Threads share no socket: a rider's own leave could reach Redis before the release
    # that queues it, which would then hand the lock to a waiter that is gone.
    lock = SyncLock(sync_backend, "ride", ttl=30)
    held = lock.acquire(timeout=0)
    wire = sync_backend._wire
    call, in_flight, go_on = wire.call, threading.Event(), threading.Event()

    def slow_release(script: object, *args: object) -> object:
        if script is RELEASE:
            in_flight.set()
            go_on.wait(10)  # the release is "on its way": the rider gives up meanwhile
        return call(script, *args)  # type: ignore[arg-type]

    wire.call = slow_release  # type: ignore[method-assign,assignment]
    outcome: list[BaseException] = []

    def ride() -> None:
        try:
            lock.acquire(timeout=0.5)
        except LockNotAcquired as exc:
            outcome.append(exc)

    rider = threading.Thread(target=ride)
    rider.start()
    deadline = time.monotonic() + 5
    while not sync_backend._riders.held["ride"].riders:  # until it rides on `held`
        assert time.monotonic() < deadline
        time.sleep(0.001)
    releaser = threading.Thread(target=lock.release, args=(held,))
    releaser.start()
    assert in_flight.wait(5)
    rider.join(5)
    assert len(outcome) == 1  # gave up while the release that queues it was in flight
    go_on.set()
    releaser.join(5)
    wire.call = call  # type: ignore[method-assign]
    # The release queued the rider and handed it the lock; its leave, sent after that,
    # released it: nothing is left for a waiter that is gone.
    k = lock_keys("ride")
    assert sync_redis_client.exists(k.owner, k.queue, k.places) == 0
    lock.release(lock.acquire(timeout=0))


def test_a_sync_rider_whose_holder_never_releases_gets_the_lock_after_the_lease(
    sync_backend: SyncRedisLockBackend,
) -> None:
    lock = SyncLock(sync_backend, "ride", ttl=0.3, timeout=10)
    lock.acquire()  # and never released: the holder "hangs"
    started = time.monotonic()
    lease = SyncLock(sync_backend, "ride", ttl=5, timeout=10).acquire()
    assert 0.25 < time.monotonic() - started < 0.3 + 1.0  # the lease, plus a bounded wait
    lock.release(lease)


# --- a real 3-master Redis Cluster -------------------------------------------


@pytest.fixture(scope="module")
def cluster_port(redis_servers: RedisServers) -> int:
    return redis_servers.cluster(3)[0].port


async def test_cluster_locks_across_slots(cluster_port: int) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster_port)
    backend = RedisLockBackend(client)
    names = [f"order/{i}" for i in range(30)] + ["{x}:y", ""]
    leases = [await Lock(backend, n, ttl=5).acquire(timeout=0) for n in names]
    slots = {client.keyslot(lock_keys(n).owner) for n in names}
    assert len(slots) > 3  # spread over the nodes
    for lease in leases:
        with pytest.raises(LockNotAcquired):
            await Lock(backend, lease.resource).acquire(timeout=0)
        await backend.release(lease)
    await backend.aclose()
    await client.aclose()


async def test_cluster_contention_is_exact_and_woken(cluster_port: int) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster_port)
    backend = RedisLockBackend(client)
    lock = Lock(backend, "hot", ttl=5, timeout=30)
    counter = 0
    fences: list[int] = []

    async def worker() -> None:
        nonlocal counter
        for _ in range(20):
            lease = await lock.acquire()
            value = counter
            await asyncio.sleep(0)
            counter = value + 1
            fences.append(lease.fence)
            await lock.release(lease)

    async with asyncio.timeout(30):
        await asyncio.gather(*(worker() for _ in range(6)))
    assert counter == 120
    assert fences == sorted(fences)
    await backend.aclose()
    await client.aclose()


def test_cluster_sync_client(cluster_port: int) -> None:
    client = redis.RedisCluster(host="127.0.0.1", port=cluster_port)
    backend = SyncRedisLockBackend(client)
    lock = SyncLock(backend, "sync-cluster", ttl=5)
    lease = lock.acquire(timeout=0)
    with pytest.raises(LockNotAcquired):
        lock.acquire(timeout=0.2)
    lock.release(lease)
    backend.close()
    client.close()


# -- direct handoff: the releaser grants the lock to the first live waiter --------------


async def _queue_raw_waiter(client: aioredis.Redis, resource: str, token: str) -> str:
    """Queue a waiter as another process would, without anybody listening for it."""
    step = Try(token, 30_000, waiter_id(token, 30_000), 60_000)
    keys, args = acquire_call(resource, step)
    assert not Attempt.from_reply(await ACQUIRE.run(client, keys, args)).granted
    return step.waiter


async def test_a_release_hands_the_lock_to_the_first_waiter(
    backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    lock = Lock(backend, "relay", ttl=30)
    held = await lock.acquire()
    waiter = await _queue_raw_waiter(redis_client, "relay", "a" * 32)
    await lock.release(held)
    k = lock_keys("relay")
    assert await redis_client.get(k.owner) == b"a" * 32  # held by the waiter already
    assert 29_000 < await redis_client.pttl(k.owner) <= 30_000  # with the TTL it asked for
    assert await redis_client.zcard(k.queue) == await redis_client.zcard(k.places) == 0
    assert int(await redis_client.get(k.fence) or 0) > held.fence
    # A waiter that missed the message finds its grant on its next attempt, renewed.
    await redis_client.pexpire(k.owner, 5_000)
    step = Try("a" * 32, 30_000, waiter, 60_000)
    again = Attempt.from_reply(await ACQUIRE.run(redis_client, *acquire_call("relay", step)))
    assert again.granted
    assert again.fence == int(await redis_client.get(k.fence) or 0)
    assert await redis_client.pttl(k.owner) > 5_000


async def test_a_lock_handed_to_a_leaving_waiter_goes_to_the_next(
    backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    lock = Lock(backend, "relay", ttl=30, timeout=10)
    held = await lock.acquire()
    gone = await _queue_raw_waiter(redis_client, "relay", "a" * 32)
    other = Lock(RedisLockBackend(redis_client), "relay", ttl=30, timeout=10)
    next_one = asyncio.create_task(other.acquire())  # another client's: queued at once
    k = lock_keys("relay")
    async with asyncio.timeout(5):
        while await redis_client.zcard(k.queue) < 2:
            await asyncio.sleep(0.005)
    await lock.release(held)  # handed to the raw waiter, which then gives up
    assert await redis_client.get(k.owner) == b"a" * 32
    await LEAVE.run(redis_client, *leave_call("relay", gone))
    async with asyncio.timeout(2):  # woken with the lock, not after a bounded wait
        lease = await next_one
    assert lease.fence > held.fence
    await other.release(lease)


async def test_an_expired_holders_lock_goes_to_the_first_waiter(
    backend: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    await Lock(backend, "relay", ttl=30).acquire()
    await _queue_raw_waiter(redis_client, "relay", "a" * 32)
    k = lock_keys("relay")
    await redis_client.delete(k.owner)  # the holder's lease runs out: nobody released it
    # A newcomer finds it free but queued for: the first waiter gets it, not the newcomer.
    step = Try("b" * 32, 30_000, "", 0)
    refused = Attempt.from_reply(await ACQUIRE.run(redis_client, *acquire_call("relay", step)))
    assert not refused.granted
    assert refused.pttl_ms > 29_000
    assert await redis_client.get(k.owner) == b"a" * 32


# -- riders: a task asking for a lock one of its own backend's tasks holds -------------------


@pytest.fixture(params=["first waiter", "channel subscribed"])
async def riding(
    request: pytest.FixtureRequest, backend: RedisLockBackend
) -> AsyncIterator[RedisLockBackend]:
    """The backend, and how its riders ride: the first waiter of a resource goes through
    subscribes to the channel after its first attempt; once other tasks listen, a rider
    joins them before its first attempt (``_join``, no I/O). A listener that waits for
    nothing keeps the channel subscribed for the second case."""
    if request.param == "first waiter":
        yield backend
        return
    channel = lock_keys("ride").channel
    await backend._waker.listen(channel, "spectator")
    try:
        yield backend
    finally:
        await backend._waker.part(channel, "spectator")


async def _ridden(backend: RedisLockBackend, resource: str = "ride") -> None:
    """Return once a task rides on our holder of ``resource`` (bounded)."""
    async with asyncio.timeout(5):
        while not backend._riders.held[resource].riders:
            await asyncio.sleep(0.001)


async def test_riders_take_one_script_per_grant_in_fifo_order(
    redis_servers: RedisServers,
) -> None:
    server = redis_servers.start()
    client = aioredis.Redis(port=server.port)
    backend = RedisLockBackend(client)
    lock = Lock(backend, "ride", ttl=10, timeout=30)
    await lock.release(await lock.acquire())  # scripts cached, connection open
    grants: list[int] = []
    inside = 0

    async def worker(n: int) -> None:
        nonlocal inside
        for _ in range(50):
            lease = await lock.acquire()
            inside += 1
            assert inside == 1
            grants.append(n)
            await asyncio.sleep(0)  # the others ask meanwhile: they ride
            inside -= 1
            await lock.release(lease)

    await client.config_resetstat()
    await asyncio.gather(*(worker(n) for n in range(8)))
    calls = {k: v["calls"] for k, v in (await client.info("commandstats")).items()}
    # Every acquire but the first few rides on a release: one script per grant (plus
    # the few first attempts made before anybody held the lock).
    assert calls["cmdstat_evalsha"] <= len(grants) + 16
    assert sorted(grants.count(n) for n in range(8)) == [50] * 8
    # FIFO: once all eight are in, each grant goes to the task that waited longest.
    assert all(len(set(grants[i : i + 8])) == 8 for i in range(8, len(grants) - 8, 8))
    await backend.aclose()
    await client.aclose()
    redis_servers.stop(server)


async def test_a_rider_goes_behind_a_waiter_queued_before_it(
    riding: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    backend = riding
    lock = Lock(backend, "ride", ttl=30, timeout=10)
    held = await lock.acquire()
    earlier = await _queue_raw_waiter(redis_client, "ride", "a" * 32)  # another process's
    rider = asyncio.create_task(lock.acquire())
    await _ridden(backend)
    assert not rider.done()
    k = lock_keys("ride")
    assert await redis_client.zrange(k.queue, 0, -1) == [earlier.encode()]  # not queued yet
    await lock.release(held)  # queues the rider behind it and hands the lock to `earlier`
    assert await redis_client.get(k.owner) == b"a" * 32
    assert await redis_client.zcard(k.queue) == 1
    await LEAVE.run(redis_client, *leave_call("ride", earlier))  # done: hands it on
    async with asyncio.timeout(2):
        lease = await rider
    assert lease.fence > held.fence
    await lock.release(lease)


async def test_a_rider_whose_holder_never_releases_gets_the_lock_after_the_lease(
    riding: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    backend = riding
    lock = Lock(backend, "ride", ttl=0.3, timeout=10)
    await lock.acquire()  # and never released: the holder "hangs"
    started = time.monotonic()
    lease = await Lock(backend, "ride", ttl=5, timeout=10).acquire()
    assert 0.25 < time.monotonic() - started < 0.3 + 1.0  # the lease, plus a bounded wait
    await lock.release(lease)


async def test_a_rider_that_gives_up_leaves_nothing_behind(
    riding: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    backend = riding
    lock = Lock(backend, "ride", ttl=30)
    held = await lock.acquire()
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0.2)  # rides, times out before any release
    cancelled = asyncio.create_task(lock.acquire(timeout=10))
    await _ridden(backend)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await lock.release(held)  # queues nobody: neither rider is there to take it
    k = lock_keys("ride")
    assert await redis_client.exists(k.owner, k.queue, k.places) == 0
    async with asyncio.timeout(1):
        await lock.release(await lock.acquire(timeout=0))


async def test_riders_of_a_holder_that_lost_its_lease_try_for_themselves(
    riding: RedisLockBackend, redis_client: aioredis.Redis
) -> None:
    backend = riding
    lock = Lock(backend, "ride", ttl=30, timeout=10)
    held = await lock.acquire()
    rider = asyncio.create_task(lock.acquire())
    await _ridden(backend)
    k = lock_keys("ride")
    await redis_client.set(k.owner, "somebody-else", px=300)  # our lease is gone
    with pytest.raises(LockNotOwned):
        await lock.release(held)  # queued nobody: the rider is told to try itself
    async with asyncio.timeout(2):  # within the other's lease and a bounded wait
        lease = await rider
    await lock.release(lease)
