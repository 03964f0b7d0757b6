"""ZooKeeper lock benchmark: headway's ``ZooKeeperLockBackend`` against kazoo's ``Lock``.

    uv run python benchmarks/zookeeper_lock_bench.py [--quick] [--hosts HOST:PORT]

Without ``--hosts`` it starts a private ZooKeeper (Debian's ``zookeeper.jar``, default
2000 ms ticks) on a free loopback port and stops it by PID at the end. For each lock:

1. uncontended acquire+release cycles, one caller: latency median / p99, cycles/s;
2. contention: 8 workers on one key for a fixed time (tasks on one headway backend;
   threads sharing one kazoo client, each with its own ``Lock``, as kazoo is used):
   grants/s, each worker's share, and the most holders ever inside at once (must be 1).

Rounds alternate the order of the two locks; rates are medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from _stats import Contention, Samples
from kazoo.client import KazooClient

from headway import ZooKeeperLockBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.zookeeper_server import ZooKeeperServer


async def headway_uncontended(hosts: str, cycles: int, out: Samples) -> None:
    backend = ZooKeeperLockBackend(hosts, prefix=f"/bench/{uuid.uuid4().hex}")
    try:
        await backend.release(await backend.acquire("u", 10, 5))  # connect, make the folder
        started = time.perf_counter()
        for _ in range(cycles):
            t = time.perf_counter()
            await backend.release(await backend.acquire("u", 10, 5))
            out.latencies.append(time.perf_counter() - t)
        out.rates.append(cycles / (time.perf_counter() - started))
    finally:
        await backend.aclose()


def kazoo_uncontended(client: KazooClient, cycles: int, out: Samples) -> None:
    lock = client.Lock(f"/bench/{uuid.uuid4().hex}/u")
    lock.acquire()
    lock.release()
    started = time.perf_counter()
    for _ in range(cycles):
        t = time.perf_counter()
        lock.acquire()
        lock.release()
        out.latencies.append(time.perf_counter() - t)
    out.rates.append(cycles / (time.perf_counter() - started))


async def headway_contended(hosts: str, workers: int, seconds: float, out: Contention) -> None:
    backend = ZooKeeperLockBackend(hosts, prefix=f"/bench/{uuid.uuid4().hex}")
    inside, grants, stop = 0, 0, time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal inside, grants
        while time.perf_counter() < stop:
            lease = await backend.acquire("c", 10, 30)
            inside += 1
            out.most_inside = max(out.most_inside, inside)
            await asyncio.sleep(0)  # the critical section
            inside -= 1
            grants += 1
            out.shares[i] += 1
            await backend.release(lease)

    try:
        await backend.release(await backend.acquire("c", 10, 5))
        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(workers)))
        out.rates.append(grants / (time.perf_counter() - started))
    finally:
        await backend.aclose()


def kazoo_contended(client: KazooClient, workers: int, seconds: float, out: Contention) -> None:
    path = f"/bench/{uuid.uuid4().hex}/c"
    inside, grants, stop = 0, 0, time.perf_counter() + seconds
    mutex = threading.Lock()  # guards the counters only

    def worker(i: int) -> None:
        nonlocal inside, grants
        lock = client.Lock(path, str(i))
        while time.perf_counter() < stop:
            lock.acquire()
            with mutex:
                inside += 1
                out.most_inside = max(out.most_inside, inside)
            time.sleep(0)
            with mutex:
                inside -= 1
                grants += 1
                out.shares[i] += 1
            lock.release()

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.rates.append(grants / (time.perf_counter() - started))


def report(name: str, u: Samples, c: Contention) -> None:
    print(
        f"{name:<8} uncontended {u.rate():7.0f} cycles/s  p50 {u.p50() * 1e3:6.2f} ms  "
        f"p99 {u.p99() * 1e3:6.2f} ms | 8 workers {c.summary()}"
    )


def run(hosts: str, rounds: int, cycles: int, seconds: float) -> None:
    client = KazooClient(hosts=hosts, timeout=30.0)
    client.start(timeout=30)
    try:
        # Unrecorded: a fresh server compiles its hot paths during the first thousand
        # requests or so, which would slow whichever subject ran first.
        asyncio.run(headway_uncontended(hosts, 500, Samples()))
        kazoo_uncontended(client, 500, Samples())
        samples = {"headway": Samples(), "kazoo": Samples()}
        contention = {"headway": Contention(), "kazoo": Contention()}
        for r in range(rounds):
            order = ["headway", "kazoo"] if r % 2 == 0 else ["kazoo", "headway"]
            for name in order:
                if name == "headway":
                    asyncio.run(headway_uncontended(hosts, cycles, samples[name]))
                    asyncio.run(headway_contended(hosts, 8, seconds, contention[name]))
                else:
                    kazoo_uncontended(client, cycles, samples[name])
                    kazoo_contended(client, 8, seconds, contention[name])
        for name in ("headway", "kazoo"):
            report(name, samples[name], contention[name])
        ratio = samples["headway"].rate() / samples["kazoo"].rate()
        contended = contention["headway"].rate() / contention["kazoo"].rate()
        print(f"headway / kazoo: uncontended x{ratio:.2f}, 8 workers x{contended:.2f}")
    finally:
        client.stop()
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--hosts", help="an existing ZooKeeper (default: a private one)")
    args = parser.parse_args()
    rounds, cycles, seconds = (1, 200, 1.0) if args.quick else (3, 1000, 3.0)
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
