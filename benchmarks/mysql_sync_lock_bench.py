"""Sync MySQL/MariaDB lock benchmark: ``SyncMySQLLockBackend`` against a plain GET_LOCK loop.

    uv run python benchmarks/mysql_sync_lock_bench.py [--quick] [--url mysql+pymysql://…]

All through SQLAlchemy's sync engine over pymysql, a pool of 16 each. Subjects:

- ``headway``: ``SyncMySQLLockBackend.from_url(url, pool_size=16)``, the documented way
  (its connections take the grant and the fence in one query);
- ``headway, own engine``: ``SyncMySQLLockBackend(create_engine(url, pool_size=16))``,
  an engine made without that flag (the fence after the grant, three round trips);
- ``plain``: check a connection out, ``SELECT GET_LOCK(name, 30)``, ``SELECT
  RELEASE_LOCK(name)``, give it back; no TTL, no fence, no interruption handling.

For each: uncontended acquire + release cycles in one thread (p50, p99, cycles/s), then
8 threads on one key for a fixed time (grants/s, each thread's share, the most holders
ever inside at once). Rounds rotate the order; rates are medians over rounds.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from _stats import Contention, Samples

from headway import SyncMySQLLockBackend

URL = sa.make_url(os.environ.get("HEADWAY_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"))
_GET = sa.text("SELECT GET_LOCK(:n, :w)")
_RELEASE = sa.text("SELECT RELEASE_LOCK(:n)")
SUBJECTS = ("headway", "headway, own engine", "plain")


Acquire = Callable[[str], Any]
Release = Callable[[Any], None]


def plain_pair(engine: sa.Engine) -> tuple[Acquire, Release]:
    def acquire(resource: str) -> tuple[sa.Connection, str]:
        conn, name = engine.connect(), f"bench:{resource}"
        assert conn.execute(_GET, {"n": name, "w": 30}).scalar() == 1
        return conn, name

    def release(held: tuple[sa.Connection, str]) -> None:
        conn, name = held
        conn.execute(_RELEASE, {"n": name})
        conn.close()

    return acquire, release


def headway_pair(backend: SyncMySQLLockBackend) -> tuple[Acquire, Release]:
    return (lambda resource: backend.acquire(resource, 10, 30)), backend.release


def uncontended(acquire: Acquire, release: Release, cycles: int, out: Samples) -> None:
    resource = f"u-{uuid.uuid4().hex}"
    release(acquire(resource))  # the pool and the fence row warm
    started = time.perf_counter()
    for _ in range(cycles):
        t = time.perf_counter()
        release(acquire(resource))
        out.latencies.append(time.perf_counter() - t)
    out.rates.append(cycles / (time.perf_counter() - started))


def contended(acquire: Acquire, release: Release, seconds: float, out: Contention) -> None:
    resource, lock = f"c-{uuid.uuid4().hex}", threading.Lock()  # lock: the counters only
    inside, grants, stop = 0, 0, time.perf_counter() + seconds

    def worker(i: int) -> None:
        nonlocal inside, grants
        while time.perf_counter() < stop:
            held = acquire(resource)
            with lock:
                inside += 1
                out.most_inside = max(out.most_inside, inside)
            time.sleep(0)  # the critical section
            with lock:
                inside -= 1
                grants += 1
                out.shares[i] += 1
            release(held)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.rates.append(grants / (time.perf_counter() - started))


def one_round(url: str, name: str, cycles: int, seconds: float, u: Samples, c: Contention) -> None:
    closers: list[Callable[[], None]]
    if name == "headway":
        backend = SyncMySQLLockBackend.from_url(url, pool_size=16)
        pair, closers = headway_pair(backend), [backend.close]
    else:
        engine = sa.create_engine(url, pool_size=16)
        own = SyncMySQLLockBackend(engine)
        pair = headway_pair(own) if name == "headway, own engine" else plain_pair(engine)
        closers = [own.close, engine.dispose]
    try:
        uncontended(*pair, cycles, u)
        contended(*pair, seconds, c)
    finally:
        for close in closers:
            close()


def report(name: str, u: Samples, c: Contention, base: tuple[float, float]) -> None:
    print(
        f"{name:<20} uncontended {u.rate():6.0f} cycles/s (x{u.rate() / base[0]:.2f})  "
        f"p50 {u.p50() * 1e3:6.3f} ms  p99 {u.p99() * 1e3:6.3f} ms | "
        f"8 threads (x{c.rate() / base[1]:.2f}) {c.summary()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--url", default=URL.set(drivername="mysql+pymysql").render_as_string(False)
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cycles, seconds = (200, 1.0) if args.quick else (1000, 3.0)
    samples = {name: Samples() for name in SUBJECTS}
    contention = {name: Contention() for name in SUBJECTS}
    for r in range(args.rounds):
        order = SUBJECTS[r % 3 :] + SUBJECTS[: r % 3]
        for name in order:
            one_round(args.url, name, cycles, seconds, samples[name], contention[name])
        print(f"round {r + 1}: " + "; ".join(
            f"{name} {samples[name].rates[-1]:.0f} / {contention[name].rates[-1]:.0f}"
            for name in SUBJECTS
        ))  # fmt: skip
    base = (samples["plain"].rate(), contention["plain"].rate())
    for name in SUBJECTS:
        report(name, samples[name], contention[name], base)


if __name__ == "__main__":
    main()
