"""One process of ``test_leasing_processes``: tasks hitting one key through a leasing limiter.

``python -m tests.ratelimit.lease_worker MODE URL KEY POLICY_JSON SECONDS TASKS CHUNK SHARE``

It prints ``ready`` once connected and starts on a ``go`` line on stdin, so that
every process starts together. ``hammer``: TASKS tasks hit the key for SECONDS
(each pausing POLICY_JSON's ``pace`` seconds between hits); it prints the realtime
interval (us) around each admission, as JSON. ``idle``: one hit, then it waits for
its lease to go back (the hold timer) and prints its count. ``solo``: one hit, then,
on a second ``go``, hits until refused. ``sync``: as ``hammer``, with a
``SyncRateLimiter`` and TASKS threads.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

from headway import (
    Leasing,
    RateLimiter,
    RedisRateLimitBackend,
    SyncRateLimiter,
    SyncRedisRateLimitBackend,
)
from headway.ratelimit.algorithms import ALGORITHMS


async def _line() -> str:
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def _now_us() -> int:
    # Realtime, the clock Redis's TIME reads on this machine: admissions are checked
    # against the server's windows.
    return time.time_ns() // 1000


async def _hammer(
    limiter: RateLimiter, key: str, seconds: float, tasks: int, pace: float
) -> list[list[int]]:
    admitted: list[list[int]] = []
    deadline = time.monotonic() + seconds

    async def task() -> None:
        while time.monotonic() < deadline:
            before = _now_us()
            decision = await limiter.hit(key)
            after = _now_us()
            if decision.allowed:
                assert not decision.failed
                admitted.append([before, after])
            # Demand spread over time (a multiple of the rate): leases are still held when
            # windows end and buckets refill, where a unit spent too late would show.
            await asyncio.sleep(pace)

    await asyncio.gather(*(task() for _ in range(tasks)))
    return admitted


async def main(mode: str, url: str, key: str, spec: str, seconds: str, tasks: str) -> None:
    chunk, share = int(sys.argv[7]), float(sys.argv[8])
    described = json.loads(spec)
    policy_class = next(a.policy for a in ALGORITHMS if a.policy.name == described["name"])
    backend = RedisRateLimitBackend.from_url(url)
    limiter = RateLimiter(
        policy_class(*described["args"]),
        backend=backend,
        budget=10.0,  # a loaded machine: no failure-mode decisions
        cache_blocked=mode == "hammer",
        lease=Leasing(chunk=chunk, share=share, hold=0.1),
    )
    await limiter.peek(f"{key}-warm")  # connected, script loaded
    print("ready", flush=True)
    await _line()
    if mode == "hammer":
        pace = float(described["pace"])
        admitted = await _hammer(limiter, key, float(seconds), int(tasks), pace)
        print(json.dumps({"admitted": admitted}), flush=True)
        return
    count = int((await limiter.hit(key)).allowed)
    if mode == "idle":
        leases = limiter._leases
        assert leases is not None
        ledger = leases.ledger
        for _ in range(500):  # until the hold timer has given the lease back
            if not ledger.held and not leases.returns:
                break
            await asyncio.sleep(0.01)
        print(json.dumps({"admitted": count, "held": len(ledger.held)}), flush=True)
        return
    print("one", flush=True)
    await _line()
    while (decision := await limiter.hit(key)).allowed:
        count += 1
    assert not decision.failed
    print(json.dumps({"admitted": count, "held": 0}), flush=True)


def sync_main(url: str, key: str, spec: str, seconds: str, tasks: str) -> None:
    chunk, share = int(sys.argv[7]), float(sys.argv[8])
    described = json.loads(spec)
    policy_class = next(a.policy for a in ALGORITHMS if a.policy.name == described["name"])
    backend = SyncRedisRateLimitBackend.from_url(url, timeout=10.0)  # a loaded machine
    limiter = SyncRateLimiter(
        policy_class(*described["args"]),
        backend=backend,
        cache_blocked=True,
        lease=Leasing(chunk=chunk, share=share, hold=0.1),
    )
    limiter.peek(f"{key}-warm")  # connected, script loaded
    print("ready", flush=True)
    sys.stdin.readline()
    admitted: list[list[int]] = []
    deadline = time.monotonic() + float(seconds)

    def thread() -> None:
        while time.monotonic() < deadline:
            before = _now_us()
            decision = limiter.hit(key)
            after = _now_us()
            if decision.allowed:
                assert not decision.failed
                admitted.append([before, after])  # list.append: atomic under threads
            time.sleep(float(described["pace"]))

    threads = [threading.Thread(target=thread) for _ in range(int(tasks))]
    for each in threads:
        each.start()
    for each in threads:
        each.join()
    limiter.return_leases()
    print(json.dumps({"admitted": admitted}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "sync":
        sync_main(*sys.argv[2:7])
    else:
        asyncio.run(main(*sys.argv[1:7]))
