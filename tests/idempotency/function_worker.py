"""A worker process for ``test_function_processes``: calls one idempotent function's key
from many tasks or threads, on PostgreSQL + Redis, and prints what every call returned.

``python -m tests.idempotency.function_worker MODE CALLS``; MODE is ``async`` (tasks),
``sync`` (threads), ``hang`` (one call whose body never ends: the test kills it) or
``gate`` (one call whose body returns once the file ``HEADWAY_TEST_GATE`` exists; what
it returned or the name of what it raised is printed).
It prints ``ready`` and starts when a line arrives on stdin, so every process calls at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from redis import asyncio as aioredis

from headway import RecordStore, RedisLockBackend, idempotent_function
from headway.idempotency.portal import submit

EFFECTS = Path(os.environ["HEADWAY_TEST_EFFECTS"])
LEASE = float(os.environ.get("HEADWAY_TEST_LEASE", "30"))


def effect(what: str) -> int:
    """Append one line to the shared effects file (O_APPEND: whole lines); lines so far."""
    with EFFECTS.open("a") as out:
        out.write(f"{what} {os.getpid()}\n")
    return len(EFFECTS.read_text().splitlines())


def options() -> dict[str, Any]:
    store = RecordStore.from_url(os.environ["HEADWAY_TEST_DATABASE_URL"])
    redis = aioredis.Redis.from_url(os.environ["HEADWAY_TEST_REDIS_URL"])
    return {
        "store": store,
        "lock_backend": RedisLockBackend(redis),
        "namespace": "tests.function_worker.charge",  # the same in every process
        "on_conflict": "wait",
        "wait_timeout": 60,
        "lease_ttl": LEASE,
    }


async def gated() -> list[Any]:
    """One call whose body waits for the test's gate file; its outcome, or its error's name."""
    gate = Path(os.environ["HEADWAY_TEST_GATE"])

    @idempotent_function(**options())
    async def charge(order: str, amount: int) -> dict[str, Any]:
        effect("charged")
        while not gate.exists():
            await asyncio.sleep(0.02)  # the test process's signal: polled
        return {"order": order, "amount": amount}

    try:
        return [await charge("o-1", 500)]
    except Exception as exc:
        return [type(exc).__name__]


def run(mode: str, calls: int) -> list[Any]:
    if mode == "gate":
        return asyncio.run(gated())
    if mode == "sync":

        @idempotent_function(**options())
        def charge(order: str, amount: int) -> dict[str, Any]:
            n = effect("charged")
            time.sleep(0.3)  # a real window for the other processes' calls to overlap
            return {"order": order, "amount": amount, "effects": n, "pid": os.getpid()}

        with ThreadPoolExecutor(calls) as pool:
            return list(pool.map(lambda _: charge("o-1", 500), range(calls)))

    @idempotent_function(**options())
    async def charge_async(order: str, amount: int) -> dict[str, Any]:
        n = effect("charged")
        if mode == "hang":
            await asyncio.Event().wait()  # killed in here
        await asyncio.sleep(0.3)
        return {"order": order, "amount": amount, "effects": n, "pid": os.getpid()}

    async def main() -> list[Any]:
        return list(await asyncio.gather(*(charge_async("o-1", 500) for _ in range(calls))))

    return asyncio.run(main())


if __name__ == "__main__":
    mode, calls = sys.argv[1], int(sys.argv[2])
    submit(asyncio.sleep(0)).result()  # start the portal thread before the start line
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(run(mode, calls)), flush=True)
