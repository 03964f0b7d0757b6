"""ZooKeeper read-write locks and semaphores: headway's against kazoo's recipes.

    uv run python benchmarks/zookeeper_modes_bench.py [--quick] [--hosts HOST:PORT]

Without ``--hosts`` it starts a private ZooKeeper (Debian's ``zookeeper.jar``, default
2000 ms ticks) on a free loopback port and stops it by PID at the end. Subjects, with
their defaults: headway's ``ReadWriteLock`` and ``Semaphore`` over a
``ZooKeeperLockBackend``, kazoo's ``ReadLock`` / ``WriteLock`` and ``Semaphore``. For each:

1. uncontended acquire+release cycles, one caller: cycles/s (a reader, a writer, a
   permit of 2);
2. 8 workers on one name for a fixed time (tasks on one headway backend; threads on one
   kazoo client, each with its own recipe objects, as kazoo is used): grants/s and the
   most holders inside at once. Read-write: every 4th acquire of a worker is a write;
   a writer inside with anyone else is counted as an overlap (must be 0). Semaphore: 2
   permits (at most 2 inside).

Rounds alternate the order of the two libraries; rates are medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from headway import Lock, ZooKeeperLockBackend
from headway.lock.shared import ReadWriteLock, Semaphore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.zookeeper_server import ZooKeeperServer

KINDS = ("read", "write", "permit")


@dataclass
class Results:
    rates: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    most_inside: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    overlaps: int = 0

    def rate(self, what: str) -> float:
        return statistics.median(self.rates[what])


def _headway_locks(backend: ZooKeeperLockBackend, name: str) -> dict[str, Lock]:
    rw = ReadWriteLock(backend, name, ttl=10, timeout=30)
    return {"read": rw.read, "write": rw.write, "permit": Semaphore(backend, name, permits=2)}


async def headway_round(hosts: str, cycles: int, seconds: float, out: Results) -> None:
    backend = ZooKeeperLockBackend(hosts, prefix=f"/bench/{uuid.uuid4().hex}")
    try:
        for kind, lock in _headway_locks(backend, "u").items():
            await lock.release(await lock.acquire())  # connect, make the folder
            started = time.perf_counter()
            for _ in range(cycles):
                await lock.release(await lock.acquire())
            out.rates[kind].append(cycles / (time.perf_counter() - started))
        locks = _headway_locks(backend, "c")
        await headway_contended(locks, ("read", "write"), seconds, out)
        await headway_contended(locks, ("permit",), seconds, out)
    finally:
        await backend.aclose()


async def headway_contended(
    locks: dict[str, Lock], kinds: tuple[str, ...], seconds: float, out: Results
) -> None:
    inside: dict[str, int] = defaultdict(int)
    grants, stop = 0, time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal grants
        n = 0
        while time.perf_counter() < stop:
            kind = kinds[-1] if (i + n) % 4 == 0 else kinds[0]
            n += 1
            lease = await locks[kind].acquire()
            grants += 1
            _enter(inside, kind, kinds, out)
            await asyncio.sleep(0)  # the critical section
            inside[kind] -= 1
            await locks[kind].release(lease)

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(8)))
    out.rates["8 " + "+".join(kinds)].append(grants / (time.perf_counter() - started))


def _enter(inside: dict[str, int], kind: str, kinds: tuple[str, ...], out: Results) -> None:
    inside[kind] += 1
    if inside["write"] and (inside["write"] > 1 or inside["read"]):
        out.overlaps += 1
    key = "8 " + "+".join(kinds)
    out.most_inside[key] = max(out.most_inside[key], sum(inside.values()))


def _kazoo_locks(client: KazooClient, path: str, who: str) -> dict[str, Any]:
    return {
        "read": client.ReadLock(f"{path}/rw", who),
        "write": client.WriteLock(f"{path}/rw", who),
        "permit": client.Semaphore(f"{path}/permits", who, max_leases=2),
    }


def kazoo_round(client: KazooClient, cycles: int, seconds: float, out: Results) -> None:
    for kind, lock in _kazoo_locks(client, f"/bench/{uuid.uuid4().hex}", "u").items():
        lock.acquire()
        lock.release()
        started = time.perf_counter()
        for _ in range(cycles):
            lock.acquire()
            lock.release()
        out.rates[kind].append(cycles / (time.perf_counter() - started))
    path = f"/bench/{uuid.uuid4().hex}"
    kazoo_contended(lambda i: _kazoo_locks(client, path, str(i)), ("read", "write"), seconds, out)
    kazoo_contended(lambda i: _kazoo_locks(client, path, str(i)), ("permit",), seconds, out)


def kazoo_contended(
    make: Callable[[int], dict[str, Any]], kinds: tuple[str, ...], seconds: float, out: Results
) -> None:
    inside: dict[str, int] = defaultdict(int)
    grants, stop = 0, time.perf_counter() + seconds
    mutex = threading.Lock()  # guards the counters only

    def worker(i: int) -> None:
        nonlocal grants
        locks, n = make(i), 0
        while time.perf_counter() < stop:
            kind = kinds[-1] if (i + n) % 4 == 0 else kinds[0]
            n += 1
            locks[kind].acquire()
            with mutex:
                grants += 1
                _enter(inside, kind, kinds, out)
            time.sleep(0)
            with mutex:
                inside[kind] -= 1
            locks[kind].release()

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.rates["8 " + "+".join(kinds)].append(grants / (time.perf_counter() - started))


COLUMNS = ("read", "write", "permit", "8 read+write", "8 permit")


def report(results: dict[str, Results]) -> None:
    print(
        "| lock | reader cycles/s | writer cycles/s | permit cycles/s | 8 workers r/w grants/s "
        "| 8 workers permits grants/s | most inside (r/w, permits) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        inside = f"{r.most_inside['8 read+write']}, {r.most_inside['8 permit']}"
        print(f"| {name} | " + " | ".join(f"{r.rate(c):.0f}" for c in COLUMNS) + f" | {inside} |")
    h, k = results["headway"], results["kazoo"]
    ratios = " | ".join(f"x {h.rate(c) / k.rate(c):.2f}" for c in COLUMNS)
    print(f"| headway / kazoo | {ratios} | |")
    print(f"writer overlaps (must be 0): headway {h.overlaps}, kazoo {k.overlaps}")
    for name, r in results.items():
        runs = {c: [round(x) for x in r.rates[c]] for c in COLUMNS}
        print(f"{name} per round: {runs}")


def run(hosts: str, rounds: int, cycles: int, seconds: float) -> None:
    client = KazooClient(hosts=hosts, timeout=30.0)
    client.start(timeout=30)
    try:
        results = {"headway": Results(), "kazoo": Results()}
        for r in range(rounds):
            order = ["headway", "kazoo"] if r % 2 == 0 else ["kazoo", "headway"]
            for name in order:
                if name == "headway":
                    asyncio.run(headway_round(hosts, cycles, seconds, results[name]))
                else:
                    kazoo_round(client, cycles, seconds, results[name])
        report(results)
    finally:
        client.stop()
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--hosts", help="an existing ZooKeeper (default: a private one)")
    args = parser.parse_args()
    rounds, cycles, seconds = (1, 100, 1.0) if args.quick else (5, 500, 3.0)
    if args.hosts:
        run(args.hosts, rounds, cycles, seconds)
        return
    with tempfile.TemporaryDirectory(prefix="hw-zk-bench") as folder:
        server = ZooKeeperServer(Path(folder), tick_ms=2000)
        server.start()
        try:
            run(server.hosts, rounds, cycles, seconds)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
