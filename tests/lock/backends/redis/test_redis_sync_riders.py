"""Riders (sync): a thread asking for a Redis lock one of its own backend's threads holds
rides on the holder's release; threads share no socket, so leaves wait for releases."""

from __future__ import annotations

import threading
import time

import redis

from headway import LockNotAcquired, SyncLock, SyncRedisLockBackend
from headway.lock.backends.redis.keys import RELEASE, lock_keys
from headway.lock.flow import Attempt, Try
from tests.servers import RedisServers


class InLine(SyncRedisLockBackend):
    """Knows which threads hold a place in line: from the moment an attempt of theirs is
    refused, each rides on our holder's release or is queued in Redis, behind everybody
    already there."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client)
        self.changed = threading.Condition()
        self.waiting: set[str] = set()

    def _attempt(self, resource: str, step: Try) -> Attempt:
        attempt = super()._attempt(resource, step)
        if not attempt.granted:
            with self.changed:
                self.waiting.add(threading.current_thread().name)
                self.changed.notify_all()
        return attempt


def test_sync_riders_take_one_script_per_grant_in_fifo_order(
    redis_servers: RedisServers,
) -> None:
    server = redis_servers.start()
    client = redis.Redis(port=server.port)
    backend = InLine(client)
    lock = SyncLock(backend, "ride", ttl=10, timeout=30)
    lock.release(lock.acquire())  # scripts cached, a connection open
    grants: list[int] = []
    inside = 0
    at_work = {str(n) for n in range(6)}  # thread names

    def worker(n: int) -> None:
        nonlocal inside
        me = str(n)
        for _ in range(30):
            lease = lock.acquire()
            with backend.changed:
                backend.waiting.discard(me)
                inside += 1
                assert inside == 1
            grants.append(n)
            # The others ask meanwhile, and they ride: release only once every other
            # thread still at work holds its place, so the order they asked in is settled.
            with backend.changed:
                assert backend.changed.wait_for(lambda: backend.waiting >= at_work - {me}, 10)
                inside -= 1
            lock.release(lease)
        with backend.changed:
            at_work.discard(me)
            backend.changed.notify_all()

    client.config_resetstat()
    threads = [threading.Thread(target=worker, args=(n,), name=str(n)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    calls = {k: v["calls"] for k, v in client.info("commandstats").items()}
    assert sorted(grants.count(n) for n in range(6)) == [30] * 6
    # Every acquire but the first few rides on a release: about one script per grant
    # (without riding, two: the release and the releasing thread's next attempt).
    assert calls["cmdstat_fcall"] <= len(grants) * 1.2 + 12
    # FIFO: each grant goes to the thread that waited longest, so the first round's
    # order repeats exactly to the end.
    assert sorted(grants[:6]) == list(range(6))
    assert grants == grants[:6] * 30
    backend.close()
    client.close()
    redis_servers.stop(server)


def test_a_sync_rider_that_gives_up_during_the_release_leaves_after_it(
    sync_redis_backend: SyncRedisLockBackend, sync_redis_client: redis.Redis
) -> None:
    # Threads share no socket: a rider's own leave could reach Redis before the release
    # that queues it, which would then hand the lock to a waiter that is gone.
    lock = SyncLock(sync_redis_backend, "ride", ttl=30)
    held = lock.acquire(timeout=0)
    wire = sync_redis_backend._wire
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
    while not sync_redis_backend._riders.held["ride"].riders:  # until it rides on `held`
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
    sync_redis_backend: SyncRedisLockBackend,
) -> None:
    lock = SyncLock(sync_redis_backend, "ride", ttl=0.3, timeout=10)
    lock.acquire()  # and never released: the holder "hangs"
    started = time.monotonic()
    lease = SyncLock(sync_redis_backend, "ride", ttl=5, timeout=10).acquire()
    assert 0.25 < time.monotonic() - started < 0.3 + 1.0  # the lease, plus a bounded wait
    lock.release(lease)
