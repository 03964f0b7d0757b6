"""Redlock benchmark: headway against aioredlock and pottery over five servers, in one run.

    uv run python benchmarks/redlock_bench.py [--quick] [--no-before]

Starts five private redis-servers on free loopback ports (stopped by PID at the end),
so the server counters see only this run's traffic. For every lock it measures:

1. uncontended acquire+release cycles on one key: cycles/s (median over rounds, the
   subjects interleaved in alternating order), latency median and p99, and the client
   process's CPU time per cycle (``time.process_time``, threads included: steadier than
   wall time on a shared machine);
2. server commands per cycle, summed over the five servers (``INFO commandstats``
   before and after, commands run inside scripts included; the counter reads
   themselves subtracted), and how many of them are script calls;
3. contention: 8 workers (tasks for async locks, threads for pottery) loop
   acquire -> racy read-yield-write -> release on one key for a fixed time:
   grants/s, each worker's share, and whether exclusion held.

``headway Redlock (before)`` is the implementation issue 16 replaced, read with
``git show BEFORE:src/headway/lock/backends/redlock.py`` and run in the same process
(left out with ``--no-before``, or when git cannot show it).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from aioredlock import Aioredlock, LockError
from pottery import Redlock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.servers import RedisServers  # noqa: E402

from headway import RedlockBackend  # noqa: E402

TTL = 10.0
N = 5


@dataclass(frozen=True)
class Config:
    rounds: int
    cycles: int
    counted: int
    workers: int
    seconds: float


FULL = Config(rounds=5, cycles=600, counted=200, workers=8, seconds=1.5)
QUICK = Config(rounds=1, cycles=200, counted=100, workers=8, seconds=0.5)


# -- the subjects: an (acquire, release) pair per worker ---------------------------------


class Pair:
    """One worker's lock: ``acquire()`` then ``release()`` (async or sync callables)."""

    def __init__(self, acquire: Callable[[], Any], release: Callable[[], Any]) -> None:
        self.acquire, self.release = acquire, release


@dataclass
class Subject:
    name: str
    is_async: bool
    note: str
    #: urls -> (worker factory taking a key, closer)
    open: Callable[[list[str]], tuple[Callable[[str], Pair], Callable[[], Awaitable[None]]]]


def _headway(backend_class: Any, fencing: bool | None) -> Callable[..., Any]:
    def open_(urls: list[str]) -> tuple[Callable[[str], Pair], Callable[[], Awaitable[None]]]:
        extra = {} if fencing is None else {"fencing": fencing}
        # Every round has a fresh token; workers of one process share one backend.
        backend = backend_class.from_urls(urls, retry_delay=(0.001, 0.01), **extra)

        def worker(key: str) -> Pair:
            held: list[Any] = []

            async def acquire() -> None:
                held.append(await backend.acquire(key, ttl=TTL, timeout=60))

            async def release() -> None:
                await backend.release(held.pop())

            return Pair(acquire, release)

        return worker, backend.aclose

    return open_


def _aioredlock(urls: list[str]) -> tuple[Callable[[str], Pair], Callable[[], Awaitable[None]]]:
    nodes = [
        {"host": "127.0.0.1", "port": int(url.rsplit(":", 1)[1].split("/")[0])} for url in urls
    ]
    manager = Aioredlock(nodes, retry_count=3, retry_delay_min=0.001, retry_delay_max=0.01)

    def worker(key: str) -> Pair:
        held: list[Any] = []

        async def acquire() -> None:
            while True:  # it gives up after retry_count rounds: ask again
                try:
                    # A lock_timeout, so it starts no watchdog task per lock.
                    held.append(await manager.lock(key, lock_timeout=TTL))
                    return
                except LockError:
                    continue

        async def release() -> None:
            await manager.unlock(held.pop())

        return Pair(acquire, release)

    return worker, manager.destroy


def _pottery(urls: list[str]) -> tuple[Callable[[str], Pair], Callable[[], Awaitable[None]]]:
    masters = {redis.Redis.from_url(url) for url in urls}

    def worker(key: str) -> Pair:
        lock = Redlock(key=key, masters=masters, auto_release_time=TTL)
        return Pair(lock.acquire, lock.release)

    async def close() -> None:
        for client in masters:
            client.close()

    return worker, close


#: The last commit with the previous Redlock (main before issue 16's Redlock work).
BEFORE = "aa92f53abfa05a01bbe084624e123269c501e9ba"


def _before() -> Any:
    """The previous RedlockBackend, as it was at ``BEFORE``."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{BEFORE}:src/headway/lock/backends/redlock.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("headway_redlock_main")
    exec(compile(source, "main:redlock.py", "exec"), module.__dict__)
    return module.RedlockBackend


def subjects(before: bool) -> list[Subject]:
    found = [
        Subject("headway Redlock", True, "fencing on (default)", _headway(RedlockBackend, None)),
        Subject(
            "headway Redlock, fencing=False",
            True,
            "no fence (lease.fence == 0)",
            _headway(RedlockBackend, False),
        ),
        Subject("aioredlock", True, "no fencing; retries after 1-10 ms", _aioredlock),
        Subject("pottery Redlock", False, "5 masters; no fencing", _pottery),
    ]
    if before:
        try:
            previous = _before()
        except (OSError, subprocess.CalledProcessError, ImportError) as exc:
            print(f"leaving out the previous Redlock: {exc}", file=sys.stderr)
            return found
        found.insert(
            2,
            Subject(
                "headway Redlock (before)",
                True,
                "previous version: fencing on",
                _headway(previous, None),
            ),
        )
    return found


# -- counters over the five servers --------------------------------------------------------


class Counters:
    def __init__(self, urls: list[str]) -> None:
        self.admins = [redis.Redis.from_url(url) for url in urls]
        self.idle = (0, 0)
        a = self.snapshot()
        b = self.snapshot()
        self.idle = (b[0] - a[0], b[1] - a[1])

    def snapshot(self) -> tuple[int, int]:
        """(commands, FCALL+EVAL+EVALSHA calls) summed over the servers, counter reads excluded."""
        total = scripts = 0
        for admin in self.admins:
            stats = admin.info("commandstats")
            total += sum(v["calls"] for v in stats.values())
            scripts += sum(
                stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("fcall", "eval", "evalsha")
            )
        return total - self.idle[0], scripts - self.idle[1]


@dataclass
class Result:
    subject: Subject
    rates: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    commands: float = 0.0
    scripts: float = 0.0
    throughputs: list[float] = field(default_factory=list)
    shares: list[list[float]] = field(default_factory=list)
    exclusive: bool = True


# -- the phases ---------------------------------------------------------------------------


async def _call(pair_fn: Callable[[], Any], is_async: bool) -> None:
    if is_async:
        await pair_fn()
    else:
        pair_fn()


async def uncontended(
    result: Result, urls: list[str], cfg: Config, counters: Counters | None
) -> None:
    s = result.subject
    worker, close = s.open(urls)
    pair = worker(f"bench:{uuid.uuid4().hex}")
    for _ in range(50):  # connect, load scripts
        await _call(pair.acquire, s.is_async)
        await _call(pair.release, s.is_async)
    if counters is not None:
        before = counters.snapshot()
        for _ in range(cfg.counted):
            await _call(pair.acquire, s.is_async)
            await _call(pair.release, s.is_async)
        after = counters.snapshot()
        result.commands = (after[0] - before[0]) / cfg.counted
        result.scripts = (after[1] - before[1]) / cfg.counted
    stamps, cpu = [time.perf_counter()], time.process_time()
    for _ in range(cfg.cycles):
        await _call(pair.acquire, s.is_async)
        await _call(pair.release, s.is_async)
        stamps.append(time.perf_counter())
    result.cpu.append((time.process_time() - cpu) / cfg.cycles)
    result.rates.append(cfg.cycles / (stamps[-1] - stamps[0]))
    result.latencies += [b - a for a, b in itertools.pairwise(stamps)]
    await close()


async def contended(result: Result, urls: list[str], cfg: Config) -> None:
    s = result.subject
    worker, close = s.open(urls)
    key = f"bench:{uuid.uuid4().hex}"
    pairs = [worker(key) for _ in range(cfg.workers)]
    counts = [0] * cfg.workers
    state = {"counter": 0, "grants": 0, "inside": 0, "most": 0}
    stop = time.monotonic() + cfg.seconds

    def enter() -> None:
        state["inside"] += 1
        state["most"] = max(state["most"], state["inside"])

    def leave(i: int, value: int, granted: float) -> None:
        state["counter"] = value + 1
        state["inside"] -= 1
        state["grants"] += 1
        counts[i] += granted < stop

    async def run_async(i: int) -> None:
        while time.monotonic() < stop:
            await pairs[i].acquire()
            granted = time.monotonic()
            enter()
            value = state["counter"]
            await asyncio.sleep(0)  # let another task in, if the lock did not keep it out
            leave(i, value, granted)
            await pairs[i].release()

    guard = threading.Lock()

    def run_sync(i: int) -> None:
        while time.monotonic() < stop:
            pairs[i].acquire()
            granted = time.monotonic()
            with guard:
                enter()
            value = state["counter"]
            time.sleep(0)
            with guard:
                leave(i, value, granted)
            pairs[i].release()

    if s.is_async:
        await asyncio.gather(*(run_async(i) for i in range(cfg.workers)))
    else:
        await asyncio.gather(*(asyncio.to_thread(run_sync, i) for i in range(cfg.workers)))
    await close()
    total = sum(counts)
    result.throughputs.append(total / cfg.seconds)
    result.shares.append([c / total if total else 0.0 for c in counts])
    result.exclusive &= state["most"] == 1 and state["counter"] == state["grants"]


# -- the run and the report ---------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(results: list[Result], cfg: Config) -> None:
    print(f"\nUncontended, {cfg.cycles} cycles x {cfg.rounds} rounds, {N} servers")
    print(
        "| lock | cycles/s (median) | p50 ms | p99 ms | client CPU µs/cycle"
        " | commands/cycle | scripts/cycle | note |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        p50, p99 = (_pct(r.latencies, q) * 1e3 for q in (0.5, 0.99))
        print(
            f"| {r.subject.name} | {statistics.median(r.rates):.0f} | {p50:.2f} | {p99:.2f}"
            f" | {statistics.median(r.cpu) * 1e6:.0f} | {r.commands:.1f} | {r.scripts:.1f}"
            f" | {r.subject.note} |"
        )
    print(f"\n{cfg.workers} workers on one key, {cfg.seconds:g} s x {cfg.rounds} rounds")
    print("| lock | grants/s (median) | min share | max share | exclusive |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in results:
        low = min(min(s) for s in r.shares)
        high = max(max(s) for s in r.shares)
        print(
            f"| {r.subject.name} | {statistics.median(r.throughputs):.0f} | {low:.1%} | {high:.1%}"
            f" | {'yes' if r.exclusive else 'NO'} |"
        )
    print("\nEach worker's share, last round:")
    for r in results:
        print(f"  {r.subject.name}: " + " ".join(f"{s:.1%}" for s in r.shares[-1]))


async def run(urls: list[str], cfg: Config, before: bool) -> list[Result]:
    results = [Result(s) for s in subjects(before)]
    counters = Counters(urls)
    for round_ in range(cfg.rounds):
        order = results if round_ % 2 == 0 else results[::-1]
        for r in order:
            await uncontended(r, urls, cfg, counters if round_ == 0 else None)
        for r in order:
            await contended(r, urls, cfg)
        print(f"round {round_ + 1}/{cfg.rounds} done", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--no-before", action="store_true", help="leave out the previous Redlock")
    options = parser.parse_args()
    cfg = QUICK if options.quick else FULL
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    with tempfile.TemporaryDirectory() as folder:
        servers = RedisServers(binary, Path(folder))
        try:
            urls = [servers.start().url for _ in range(N)]
            results = asyncio.run(run(urls, cfg, not options.no_before))
        finally:
            servers.stop_all()
    report(results, cfg)


if __name__ == "__main__":
    main()
