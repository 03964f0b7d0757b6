"""MySQL/MariaDB lock benchmark: headway's ``MySQLLockBackend`` against a plain GET_LOCK loop.

    uv run python benchmarks/mysql_lock_bench.py [--quick] [--url mysql+aiomysql://…]

Both run through the same driver (SQLAlchemy's async engine over aiomysql, one pool of
16 connections each). The plain loop is the least a correct per-lease session costs:
check a connection out, ``SELECT GET_LOCK(name, 30)``, ``SELECT RELEASE_LOCK(name)``,
give it back; no TTL, no fence, no cancellation handling. For each:

1. uncontended acquire+release cycles, one caller: latency median / p99, cycles/s;
2. contention: 8 tasks on one key for a fixed time: grants/s, each worker's share,
   and the most holders ever inside at once (must be 1).

Rounds alternate the order of the two; rates are medians over rounds. The statements
headway sends per cycle are counted from the session's ``Questions`` status.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from _stats import Contention, Samples
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from headway import Lease, MySQLLockBackend

URL = os.environ.get("HEADWAY_TEST_MYSQL_URL", "mysql+aiomysql://root@127.0.0.1:3306/test")
_GET = sa.text("SELECT GET_LOCK(:n, :w)")
_RELEASE = sa.text("SELECT RELEASE_LOCK(:n)")


Cycle = Callable[[str], Awaitable[None]]
Acquire = Callable[[str], Awaitable[Any]]
Release = Callable[[Any], Awaitable[None]]


def headway_cycle(backend: MySQLLockBackend) -> Cycle:
    async def cycle(resource: str) -> None:
        await backend.release(await backend.acquire(resource, 10, 30))

    return cycle


def plain_cycle(engine: AsyncEngine) -> Cycle:
    async def cycle(resource: str) -> None:
        name = f"bench:{resource}"
        async with engine.connect() as conn:
            assert (await conn.execute(_GET, {"n": name, "w": 30})).scalar() == 1
            await conn.execute(_RELEASE, {"n": name})

    return cycle


async def uncontended(cycle: Cycle, cycles: int, out: Samples) -> None:
    resource = f"u-{uuid.uuid4().hex}"
    await cycle(resource)  # the pool and the fence row warm
    started = time.perf_counter()
    for _ in range(cycles):
        t = time.perf_counter()
        await cycle(resource)
        out.latencies.append(time.perf_counter() - t)
    out.rates.append(cycles / (time.perf_counter() - started))


async def contended(
    acquire: Acquire,
    release: Release,
    workers: int,
    seconds: float,
    out: Contention,
) -> None:
    resource = f"c-{uuid.uuid4().hex}"
    inside, grants = 0, 0
    await release(await acquire(resource))
    stop = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal inside, grants
        while time.perf_counter() < stop:
            held = await acquire(resource)
            inside += 1
            out.most_inside = max(out.most_inside, inside)
            await asyncio.sleep(0)  # the critical section
            inside -= 1
            grants += 1
            out.shares[i] += 1
            await release(held)

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    out.rates.append(grants / (time.perf_counter() - started))


async def statements_per_cycle(url: str) -> int:
    engine = create_async_engine(url, pool_size=1, max_overflow=0)
    backend = MySQLLockBackend(engine)
    questions = sa.text("SHOW SESSION STATUS LIKE 'Questions'")
    try:
        await headway_cycle(backend)("q")
        async with engine.connect() as conn:
            before = int((await conn.execute(questions)).one()[1])
        await headway_cycle(backend)("q")
        async with engine.connect() as conn:
            after = int((await conn.execute(questions)).one()[1])
        # Between the two reads: the first read's connection going back (a rollback),
        # the cycle, and the second read itself.
        return after - before - 2
    finally:
        await engine.dispose()


def headway_pair(backend: MySQLLockBackend) -> tuple[Acquire, Release]:
    async def acquire(resource: str) -> Lease:
        return await backend.acquire(resource, 10, 30)

    return acquire, backend.release


def plain_pair(engine: AsyncEngine) -> tuple[Acquire, Release]:
    async def acquire(resource: str) -> tuple[AsyncConnection, str]:
        conn = await engine.connect().start()
        name = f"bench:{resource}"
        assert (await conn.execute(_GET, {"n": name, "w": 30})).scalar() == 1
        return conn, name

    async def release(held: tuple[AsyncConnection, str]) -> None:
        conn, name = held
        await conn.execute(_RELEASE, {"n": name})
        await conn.close()

    return acquire, release


async def one_round(
    url: str, name: str, cycles: int, seconds: float, u: Samples, c: Contention
) -> None:
    engine = create_async_engine(url, pool_size=16, max_overflow=0)
    try:
        if name == "headway":
            backend = MySQLLockBackend(engine)
            await uncontended(headway_cycle(backend), cycles, u)
            await contended(*headway_pair(backend), 8, seconds, c)
        else:
            await uncontended(plain_cycle(engine), cycles, u)
            await contended(*plain_pair(engine), 8, seconds, c)
    finally:
        await engine.dispose()


def report(name: str, u: Samples, c: Contention) -> None:
    print(
        f"{name:<8} uncontended {u.rate():7.0f} cycles/s  p50 {u.p50() * 1e3:6.3f} ms  "
        f"p99 {u.p99() * 1e3:6.3f} ms | 8 workers {c.summary()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=URL)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cycles, seconds = (200, 1.0) if args.quick else (1000, 3.0)
    samples = {"headway": Samples(), "plain": Samples()}
    contention = {"headway": Contention(), "plain": Contention()}
    for r in range(args.rounds):
        for name in ["headway", "plain"] if r % 2 == 0 else ["plain", "headway"]:
            asyncio.run(one_round(args.url, name, cycles, seconds, samples[name], contention[name]))
        print(
            f"round {r + 1}: uncontended headway {samples['headway'].rates[-1]:.0f} / plain "
            f"{samples['plain'].rates[-1]:.0f} cycles/s; 8 workers headway "
            f"{contention['headway'].rates[-1]:.0f} / plain {contention['plain'].rates[-1]:.0f}"
        )
    for name in samples:
        report(name, samples[name], contention[name])
    h, p = samples["headway"].rate(), samples["plain"].rate()
    hc, pc = contention["headway"].rate(), contention["plain"].rate()
    print(f"headway / plain: uncontended {h / p:.2f}x, 8 workers {hc / pc:.2f}x")
    print(f"statements per headway cycle: {asyncio.run(statements_per_cycle(args.url))}")


if __name__ == "__main__":
    main()
