"""One process of ``test_mixed_contention.py``: several tasks (or threads) on one lock.

Each task runs critical sections on the resource: mark itself inside (``INCR``),
read the shared counter, yield, write it back plus one, log the lease's fence,
leave (``DECR``), release. Tasks of this process ride on each other's releases;
other processes' tasks queue in Redis, so both kinds of hand-over happen. Prints
one JSON line: sections per task, the most holders ever seen inside, and how
the attempts went: ``rides``, answered by a ride on a holder of this process, and
``queued``, sent to Redis and refused (so the attempt queued there).

Usage: python -m tests.lock.mixed_worker async|sync REDIS_URL RESOURCE TASKS SECTIONS
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

import redis
from redis import asyncio as aioredis

from headway import Lock, RedisLockBackend, SyncLock, SyncRedisLockBackend


async def main(url: str, resource: str, tasks: int, sections: int) -> None:
    client = aioredis.Redis.from_url(url)
    backend = RedisLockBackend(client)
    counts = {"rides": 0, "queued": 0}
    ride, attempt = backend._ride, backend._try

    def counted_ride(*args: Any) -> Any:
        ridden = ride(*args)
        counts["rides"] += ridden is not None
        return ridden

    async def counted_try(*args: Any) -> Any:
        tried = await attempt(*args)
        counts["queued"] += not tried.granted
        return tried

    backend._ride = counted_ride  # type: ignore[method-assign,assignment]
    backend._try = counted_try  # type: ignore[method-assign,assignment]
    lock = Lock(backend, resource, ttl=10, timeout=30)
    done = [0] * tasks
    crowd = 0

    async def task(n: int) -> None:
        nonlocal crowd
        for _ in range(sections):
            lease = await lock.acquire()
            inside = await client.incr(f"{resource}:inside")
            crowd = max(crowd, inside)
            value = int(await client.get(f"{resource}:counter") or 0)
            await asyncio.sleep(0)  # the others ask meanwhile: they ride or queue
            await client.set(f"{resource}:counter", value + 1)
            await client.rpush(f"{resource}:fences", lease.fence)
            await client.decr(f"{resource}:inside")
            done[n] += 1
            await lock.release(lease)

    await asyncio.gather(*(task(n) for n in range(tasks)))
    await backend.aclose()
    await client.aclose()
    print(json.dumps({"done": done, "crowd": crowd, **counts}))


def main_sync(url: str, resource: str, threads: int, sections: int) -> None:
    client = redis.Redis.from_url(url)
    backend = SyncRedisLockBackend(client)
    counts = {"rides": 0, "queued": 0}
    ride, attempt, guard = backend._ride, backend._try, threading.Lock()

    def counted_ride(*args: Any) -> Any:
        ridden = ride(*args)
        with guard:
            counts["rides"] += ridden is not None
        return ridden

    def counted_try(*args: Any) -> Any:
        tried = attempt(*args)
        with guard:
            counts["queued"] += not tried.granted
        return tried

    backend._ride = counted_ride  # type: ignore[method-assign,assignment]
    backend._try = counted_try  # type: ignore[method-assign,assignment]
    lock = SyncLock(backend, resource, ttl=10, timeout=30)
    done = [0] * threads
    crowd = 0

    def thread(n: int) -> None:
        nonlocal crowd
        for _ in range(sections):
            lease = lock.acquire()
            inside = int(client.incr(f"{resource}:inside"))
            crowd = max(crowd, inside)
            value = int(client.get(f"{resource}:counter") or 0)
            client.set(f"{resource}:counter", value + 1)
            client.rpush(f"{resource}:fences", lease.fence)
            client.decr(f"{resource}:inside")
            done[n] += 1
            lock.release(lease)

    workers = [threading.Thread(target=thread, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    backend.close()
    client.close()
    print(json.dumps({"done": done, "crowd": crowd, **counts}))


if __name__ == "__main__":
    mode, url, resource, tasks, sections = sys.argv[1:6]
    if mode == "sync":
        main_sync(url, resource, int(tasks), int(sections))
    else:
        asyncio.run(main(url, resource, int(tasks), int(sections)))
