"""The measured phases of ``lock_bench.py``: one lock, uncontended or contended.

``Server`` reads the server's counters; ``Result`` accumulates one lock's
numbers over rounds.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from dataclasses import dataclass, field

import redis
from _lock_subjects import CountingAsyncConnection, CountingConnection, Subject, Writes
from redis import asyncio as aioredis


@dataclass
class Config:
    rounds: int
    cycles: int
    counted: int
    workers: int
    seconds: float
    #: Seconds each worker spends outside the lock between grants (its own work).
    think: float = 0.0


@dataclass
class Result:
    subject: Subject
    latencies: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    round_trips: float = 0.0
    commands: float = 0.0
    scripts: float = 0.0
    throughputs: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    min_share: float = 1.0
    exclusive: bool = True


class Server:
    """Reads the server's counters with a client of its own (not counted)."""

    def __init__(self, url: str) -> None:
        self.admin = redis.Redis.from_url(url)
        self.idle = 0
        # Reading the counters costs commands too: measure that once, then subtract it.
        self.idle = self._idle()

    def _idle(self) -> int:
        before = self.snapshot()
        return self.snapshot()[0] - before[0]

    def snapshot(self) -> tuple[int, int]:
        """(total commands processed, FCALL + EVAL + EVALSHA calls) so far."""
        stats = self.admin.info("commandstats")
        scripts = sum(
            stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("fcall", "eval", "evalsha")
        )
        total: int = self.admin.info("stats")["total_commands_processed"]
        return total, scripts

    def count(self, result: Result, before: tuple[int, int], n: int) -> None:
        """Store per-cycle counts of the ``n`` cycles run since ``before`` (and ``Writes``)."""
        total, scripts = self.snapshot()
        result.round_trips = Writes.count / n
        result.commands = (total - before[0] - self.idle) / n
        result.scripts = (scripts - before[1]) / n


# -- one subject, one phase ---------------------------------------------------------------


def _timed(result: Result, n: int, started: float, stamps: list[float]) -> None:
    result.latencies += [b - a for a, b in itertools.pairwise(stamps)]
    result.rates.append(n / (stamps[-1] - started))


def uncontended_sync(result: Result, url: str, cfg: Config, server: Server | None) -> None:
    client = redis.Redis.from_url(url, connection_class=CountingConnection)
    worker = result.subject.make(client, f"bench:{uuid.uuid4().hex}")()
    for _ in range(50):
        worker.acquire()
        worker.release()
    if server is not None:
        wire_requests = getattr(worker, "wire_requests", lambda: 0)
        before, Writes.count, requests = server.snapshot(), 0, wire_requests()
        for _ in range(cfg.counted):
            worker.acquire()
            worker.release()
        Writes.count += wire_requests() - requests
        server.count(result, before, cfg.counted)
    stamps = [time.perf_counter()]
    for _ in range(cfg.cycles):
        worker.acquire()
        worker.release()
        stamps.append(time.perf_counter())
    _timed(result, cfg.cycles, stamps[0], stamps)
    worker.close()
    client.close()


async def uncontended_async(result: Result, url: str, cfg: Config, server: Server | None) -> None:
    client = aioredis.Redis.from_url(url, connection_class=CountingAsyncConnection)
    worker = result.subject.make(client, f"bench:{uuid.uuid4().hex}")()
    for _ in range(50):
        await worker.acquire()
        await worker.release()
    if server is not None:
        # The counters are read with a blocking client, outside the measured cycles.
        # headway's own connection counts its requests itself.
        wire_requests = getattr(worker, "wire_requests", lambda: 0)
        before, Writes.count, requests = server.snapshot(), 0, wire_requests()
        for _ in range(cfg.counted):
            await worker.acquire()
            await worker.release()
        Writes.count += wire_requests() - requests
        server.count(result, before, cfg.counted)
    stamps = [time.perf_counter()]
    for _ in range(cfg.cycles):
        await worker.acquire()
        await worker.release()
        stamps.append(time.perf_counter())
    _timed(result, cfg.cycles, stamps[0], stamps)
    await worker.aclose()
    await client.aclose()


@dataclass
class _Shared:
    """What the critical section touches: a racy counter and the holders inside."""

    inside: int = 0
    most: int = 0
    counter: int = 0
    grants: int = 0

    def enter(self) -> None:
        self.inside += 1
        self.most = max(self.most, self.inside)

    def leave(self) -> None:
        self.inside -= 1
        self.grants += 1


def _record(
    result: Result, counts: list[int], seconds: float, shared: _Shared, commands: int
) -> None:
    total = sum(counts)
    result.throughputs.append(total / seconds)
    result.load.append(commands / shared.grants)
    result.min_share = min(result.min_share, min(counts) / total if total else 0.0)
    result.exclusive &= shared.most == 1 and shared.counter == shared.grants


def contended_sync(result: Result, url: str, cfg: Config, server: Server) -> None:
    before = server.snapshot()
    client = redis.Redis.from_url(url)
    factory = result.subject.make(client, f"bench:{uuid.uuid4().hex}")
    workers = [factory() for _ in range(cfg.workers)]
    counts = [0] * cfg.workers
    shared, guard = _Shared(), threading.Lock()
    start = threading.Barrier(cfg.workers + 1)
    stop = 0.0

    def run(i: int) -> None:
        start.wait()
        while time.monotonic() < stop:
            workers[i].acquire()
            granted = time.monotonic()
            with guard:
                shared.enter()
            value = shared.counter
            time.sleep(0)  # let another thread in, if the lock did not keep it out
            shared.counter = value + 1
            with guard:
                shared.leave()
            workers[i].release()
            counts[i] += granted < stop
            if cfg.think:
                time.sleep(cfg.think)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(cfg.workers)]
    for thread in threads:
        thread.start()
    stop = time.monotonic() + cfg.seconds
    start.wait()
    for thread in threads:
        thread.join()
    workers[0].close()
    client.close()
    _record(result, counts, cfg.seconds, shared, server.snapshot()[0] - before[0] - server.idle)


async def contended_async(result: Result, url: str, cfg: Config, server: Server) -> None:
    before = server.snapshot()
    client = aioredis.Redis.from_url(url)
    factory = result.subject.make(client, f"bench:{uuid.uuid4().hex}")
    workers = [factory() for _ in range(cfg.workers)]
    counts = [0] * cfg.workers
    shared = _Shared()
    stop = time.monotonic() + cfg.seconds

    async def run(i: int) -> None:
        while time.monotonic() < stop:
            await workers[i].acquire()
            granted = time.monotonic()
            shared.enter()
            value = shared.counter
            await asyncio.sleep(0)  # let another task in, if the lock did not keep it out
            shared.counter = value + 1
            shared.leave()
            await workers[i].release()
            counts[i] += granted < stop
            if cfg.think:
                await asyncio.sleep(cfg.think)

    await asyncio.gather(*(run(i) for i in range(cfg.workers)))
    await workers[0].aclose()
    await client.aclose()
    _record(result, counts, cfg.seconds, shared, server.snapshot()[0] - before[0] - server.idle)
