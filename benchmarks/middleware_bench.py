"""Middleware benchmark: headway against slowapi and fastapi-limiter on one app and one Redis.

    uv run python benchmarks/middleware_bench.py [--quick] [--url redis://HOST:PORT/DB]

Without ``--url`` it starts a private redis-server on a free loopback port. For
each subject of ``_mw_apps`` (the bare app, the bare app making one decision,
headway's middleware and decorator, slowapi, fastapi-limiter), every request admitted:

1. in-process: GET /ping straight through the ASGI app (no HTTP client, so the
   timings hold the app and the limiter, not a client library): latency
   median / p99 of sequential requests, and requests/s with 16 concurrent
   tasks;
2. over a real server: the same app under uvicorn in its own process on a free
   loopback port, driven by a minimal keep-alive HTTP/1.1 client (16
   connections for the concurrent part): the same numbers, twice: uvicorn's
   pure-Python stack (h11, asyncio loop) and what ``uvicorn[standard]`` (and so
   ``fastapi[standard]``) runs by default (httptools, uvloop).

"Added" latencies subtract the bare app's. "one decision" is the bare app whose
endpoint awaits one ``RateLimiter.hit`` on the same Redis: what a limiter decision
costs inside a request, which the latency target compares the middleware with
(a decision timed alone in a tight loop, also printed, runs hotter than one made
between a server's requests). Each setting starts every subject's server once
and runs its rounds back to back, alternating the order of the subjects, so a
machine whose load drifts skews them alike; the throughput ratio to slowapi is
taken per round (the two rates measured seconds apart) and its median reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _mw_apps import HUGE, SUBJECTS, build
from redis import asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _stats import Samples
from tests.servers import free_port, private_redis

from headway import FixedWindow, RateLimiter, RedisRateLimitBackend

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Config:
    rounds: int
    sequential: int  # requests timed one by one, per subject and round
    concurrent: int  # requests sent by 16 tasks, per subject and round
    warmup: int = 200
    tasks: int = 16


FULL = Config(rounds=5, sequential=2000, concurrent=4000)
QUICK = Config(rounds=1, sequential=300, concurrent=600, warmup=50)


# -- in-process: the ASGI app called directly ------------------------------------------------

SCOPE: dict[str, Any] = {
    "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
    "method": "GET", "scheme": "http", "path": "/ping", "raw_path": b"/ping", "root_path": "",
    "query_string": b"", "headers": [(b"host", b"bench")], "client": ("127.0.0.1", 50000),
    "server": ("bench", 80),
}  # fmt: skip


async def call(app: Any) -> int:
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(dict(SCOPE), receive, send)
    return status


async def startup(app: Any) -> asyncio.Task[None]:
    """Run the app's lifespan startup (uvicorn does it for the server runs); cancel to end."""
    events = asyncio.Queue[dict[str, Any]]()
    await events.put({"type": "lifespan.startup"})
    done = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"].startswith("lifespan.startup"):
            done.set()

    task = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, events.get, send)
    )
    await done.wait()
    return task


async def in_process(subject: str, url: str, config: Config, into: Samples) -> None:
    app = build(subject, url)
    lifespan = await startup(app)
    try:
        await _in_process(app, subject, config, into)
    finally:
        lifespan.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lifespan


async def _in_process(app: Any, subject: str, config: Config, into: Samples) -> None:
    for _ in range(config.warmup):
        assert await call(app) == 200, subject
    for _ in range(config.sequential):
        start = time.perf_counter()
        status = await call(app)
        into.latencies.append(time.perf_counter() - start)
        assert status == 200, (subject, status)
    per_task = config.concurrent // config.tasks

    async def worker() -> None:
        for _ in range(per_task):
            assert await call(app) == 200

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(config.tasks)))
    into.rates.append(per_task * config.tasks / (time.perf_counter() - start))


# -- over a real server: uvicorn in its own process ------------------------------------------


#: uvicorn's options per server run: its pure-Python stack, and uvicorn[standard]'s.
SERVERS = {
    "server": ["--http", "h11", "--loop", "asyncio"],
    "server-standard": ["--http", "httptools", "--loop", "uvloop"],
}


@contextmanager
def uvicorn_server(subject: str, url: str, where: str) -> Iterator[int]:
    port = free_port()
    env = {**os.environ, "BENCH_SUBJECT": subject, "BENCH_REDIS_URL": url}
    argv = [
        sys.executable, "-m", "uvicorn", "_mw_apps:make_app", "--factory",
        "--app-dir", str(HERE), "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "warning", "--no-access-log", *SERVERS[where],
    ]  # fmt: skip
    process = subprocess.Popen(argv, env=env, cwd=HERE.parent)
    try:
        deadline = time.monotonic() + 30
        while True:  # a benchmark may wait for its server; tests never poll like this
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"uvicorn for {subject!r} did not start") from None
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(10)


class Connection:
    """A minimal HTTP/1.1 keep-alive client: a load generator far lighter than httpx (whose
    own overhead, ~2 ms a request on a loaded 2-core machine, would hide the servers')."""

    REQUEST = b"GET /ping HTTP/1.1\r\nHost: bench\r\n\r\n"

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    async def get(self) -> int:
        self.writer.write(self.REQUEST)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await self.reader.readexactly(length)
        return int(head[9:12])

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


@contextmanager
def uvicorn_servers(subjects: list[str], url: str, where: str) -> Iterator[dict[str, int]]:
    """Every subject's server at once (an idle one costs nothing), so that the rounds of
    one setting follow each other closely instead of waiting for servers to start."""
    with contextlib.ExitStack() as stack:
        yield {s: stack.enter_context(uvicorn_server(s, url, where)) for s in subjects}


async def over_server(port: int, subject: str, config: Config, into: Samples) -> None:
    connections = [await Connection.open(port) for _ in range(config.tasks)]
    one = connections[0]
    for _ in range(config.warmup):
        assert await one.get() == 200, subject
    for _ in range(config.sequential):
        start = time.perf_counter()
        status = await one.get()
        into.latencies.append(time.perf_counter() - start)
        assert status == 200, (subject, status)
    per_task = config.concurrent // config.tasks

    async def worker(connection: Connection) -> None:
        for _ in range(per_task):
            assert await connection.get() == 200

    start = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    into.rates.append(per_task * config.tasks / (time.perf_counter() - start))
    for connection in connections:
        await connection.close()


# -- one limiter decision: the floor ------------------------------------------------------------


async def floor(url: str, config: Config) -> Samples:
    client = aioredis.Redis.from_url(url)
    limiter = RateLimiter(FixedWindow(HUGE, 3600.0), backend=RedisRateLimitBackend(client))
    samples = Samples()
    for _ in range(config.warmup):
        await limiter.hit("bench-floor")
    for _ in range(config.sequential * config.rounds):
        start = time.perf_counter()
        await limiter.hit("bench-floor")
        samples.latencies.append(time.perf_counter() - start)
    await client.aclose()
    return samples


# -- the run and the report ---------------------------------------------------------------------


@contextmanager
def redis_url(url: str | None) -> Iterator[tuple[str, bool]]:
    """``(url, private)``: ``url`` as given, or a private redis-server's."""
    if url is not None:
        yield url, False
        return
    with private_redis() as private:
        yield private, True


@contextmanager
def delayed(url: str, rtt_ms: float) -> Iterator[str]:
    """``url`` reached through a relay adding ``rtt_ms`` of round trip (a remote Redis)."""
    if not rtt_ms:
        yield url
        return
    parts = urlsplit(url)
    port = free_port()
    relay = [sys.executable, str(HERE / "_delay_proxy.py"), str(port), str(parts.port), str(rtt_ms)]
    process = subprocess.Popen(relay)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the delay relay did not start") from None
                time.sleep(0.02)
        yield parts._replace(netloc=f"127.0.0.1:{port}").geturl()
    finally:
        process.terminate()
        process.wait(10)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def report(floor_: Samples, results: dict[str, dict[str, Samples]], config: Config) -> str:
    lines = [
        f"One limiter decision timed alone in a tight loop (RateLimiter.hit, FixedWindow, "
        f"same Redis): p50 {us(floor_.p50())} µs, p99 {us(floor_.p99())} µs. The targets use "
        f"the 'one decision' row: the same decision made inside a request.",
        "",
    ]
    titles = {
        "in-process": "In-process (ASGI app called directly)",
        "server": "Over uvicorn, h11 + asyncio (own process, keep-alive HTTP/1.1 client)",
        "server-standard": "Over uvicorn[standard], httptools + uvloop (the same client)",
    }
    for where, title in titles.items():
        if where not in results:
            continue
        base = results[where]["bare"]
        lines += [
            f"{title}: {config.rounds} round(s) x {config.sequential} sequential requests, "
            f"{config.concurrent} with {config.tasks} concurrent tasks",
            "",
            "| subject | req/s (16 tasks) | p50 µs | p99 µs | added p50 µs | added p99 µs |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for subject, samples in results[where].items():
            added = (
                ("—", "—") if subject == "bare"
                else (us(samples.p50() - base.p50()), us(samples.p99() - base.p99()))
            )  # fmt: skip
            lines.append(
                f"| {subject} | {samples.rate():,.0f} | {us(samples.p50())} | "
                f"{us(samples.p99())} | {added[0]} | {added[1]} |"
            )
        headway = results[where]["headway middleware"]
        slow = results[where]["slowapi"]
        added_p50 = headway.p50() - base.p50()
        decision = results[where]["one decision"].p50() - base.p50()
        budget = decision + 50e-6
        # Each round measures both within seconds: the ratio is taken per round (drift in
        # the machine's speed over minutes cancels), then its median.
        ratios = [h / s for h, s in zip(headway.rates, slow.rates, strict=True)]
        ratio = statistics.median(ratios)
        lines += [
            "",
            f"Targets ({where}): added p50 {us(added_p50)} µs vs one decision in situ "
            f"({us(decision)} µs) + 50 µs = {us(budget)} µs -> "
            f"{'met' if added_p50 <= budget else 'MISSED'}; "
            f"throughput {ratio:.2f}x slowapi's (rounds {min(ratios):.2f}-{max(ratios):.2f}x) -> "
            f"{'met' if ratio >= 2 else 'MISSED'}",
            "",
        ]
    return "\n".join(lines)


async def run(url: str, private: bool, config: Config, server: bool) -> str:
    subjects = list(SUBJECTS)
    wheres = ["in-process", *SERVERS] if server else ["in-process"]
    results = {where: {s: Samples() for s in subjects} for where in wheres}
    flusher = aioredis.Redis.from_url(url)
    for where in wheres:
        servers: contextlib.AbstractContextManager[dict[str, int]] = (
            contextlib.nullcontext({}) if where == "in-process"
            else uvicorn_servers(subjects, url, where)
        )  # fmt: skip
        with servers as ports:
            for round_ in range(config.rounds):
                for subject in subjects if round_ % 2 == 0 else subjects[::-1]:
                    if private:
                        await flusher.flushall()  # our own throw-away server
                    print(f"round {round_ + 1} {where:<10} {subject}", file=sys.stderr)
                    into = results[where][subject]
                    if where == "in-process":
                        await in_process(subject, url, config, into)
                    else:
                        await over_server(ports[subject], subject, config, into)
    await flusher.aclose()
    floor_ = await floor(url, config)
    return report(floor_, results, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--url", help="an existing Redis (default: a private redis-server)")
    parser.add_argument("--no-server", action="store_true", help="skip the uvicorn runs")
    parser.add_argument(
        "--rtt-ms", type=float, default=0.0,
        help="reach Redis through a relay adding this round trip (a Redis on another host)",
    )  # fmt: skip
    args = parser.parse_args()
    config = QUICK if args.quick else FULL
    with redis_url(args.url) as (direct, private), delayed(direct, args.rtt_ms) as url:
        if args.rtt_ms:
            print(f"Redis reached through a relay adding {args.rtt_ms:g} ms of round trip\n")
        print(asyncio.run(run(url, private, config, not args.no_server)))


if __name__ == "__main__":
    main()
