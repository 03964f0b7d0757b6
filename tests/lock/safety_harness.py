"""The parent's side of the safety tests (``test_safety.py``, ``test_modes_safety.py``).

The parent runs a worker module (``safety_worker.fork``: one zygote forks the
workers), talks to each worker over a Unix socket, one line at a time, and
SIGSTOPs workers at their checkpoints; ``spawn`` kills whatever is left if the
run overruns its budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from redis import asyncio as aioredis

ROOT = Path(__file__).resolve().parents[2]
PAUSE = 1.5  # well past the TTL (and ZooKeeper's 1 s session): another worker takes over
#: Backends whose leases outlive the TTL: etcd holds a lease for whole seconds, 2 s at
#: least, and revokes expired leases every 0.5 s; MySQL's wait_timeout is whole seconds.
PAUSES = {"etcd": 3.5, "mysql": 2.5}


@dataclass
class Worker:
    index: int
    pid: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    since_pause: int = 0
    result: dict[str, Any] | None = None

    async def answer(self, text: str) -> None:
        self.writer.write(f"{text}\n".encode())
        await self.writer.drain()


@dataclass
class Crowd:
    """The workers of one run, started together once all ``size`` are ready."""

    size: int
    workers: dict[int, Worker] = field(default_factory=dict)
    all_ready: asyncio.Event = field(default_factory=asyncio.Event)

    async def join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Worker:
        """Take a worker's ``ready INDEX PID`` line; answer ``start`` once everyone is in."""
        kind, index, pid = (await reader.readline()).decode().split()
        assert kind == "ready"
        w = self.workers[int(index)] = Worker(int(index), int(pid), reader, writer)
        if len(self.workers) == self.size:
            self.all_ready.set()
        await self.all_ready.wait()
        await w.answer("start")
        return w


def service_urls(
    backend: str, redis_url: str, postgres_url: str, request: pytest.FixtureRequest
) -> dict[str, str]:
    """The environment the workers need for ``backend``."""
    urls = {"HEADWAY_TEST_REDIS_URL": redis_url, "HEADWAY_TEST_DATABASE_URL": postgres_url}
    if backend == "etcd":
        urls["HEADWAY_TEST_ETCD_URL"] = request.getfixturevalue("etcd_url")
    if backend == "redlock":
        urls["HEADWAY_TEST_REDLOCK_URLS"] = ",".join(request.getfixturevalue("redlock_urls"))
    if backend == "mysql":
        urls["HEADWAY_TEST_MYSQL_URL"] = request.getfixturevalue("mysql_url")
    if backend == "zookeeper":
        # Its own server with 100 ms ticks, so a session (the lease) can end within PAUSE.
        urls["HEADWAY_TEST_ZOOKEEPER_HOSTS"] = request.getfixturevalue("fast_zookeeper").hosts
    return urls


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def spawn(
    module: str,
    args: list[str],
    urls: dict[str, str],
    log: Path,
    serve: Serve,
    crowd: Crowd,
    budget: float,
    state: Callable[[], object],
) -> None:
    """Run ``python -m module *args SOCKET`` with ``urls`` in its environment, serving its
    workers' lines with ``serve``; fail if it overruns ``budget`` s (showing ``state()``)
    or exits non-zero (showing the tail of its stderr, kept in ``log``)."""
    with tempfile.TemporaryDirectory(prefix="hw") as folder, log.open("wb") as stderr:
        path = os.path.join(folder, "s")  # short: Unix socket paths are limited
        server = await asyncio.start_unix_server(serve, path=path)
        zygote = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", module, *args, path),
            cwd=ROOT,
            env={**os.environ, **urls},
            stdin=asyncio.subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            async with asyncio.timeout(budget):
                code = await zygote.wait()
        except TimeoutError:
            pytest.fail(f"workers did not finish within {budget} s; {state()}")
        finally:
            if zygote.returncode is None:
                for w in crowd.workers.values():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w.pid, signal.SIGKILL)
                zygote.kill()
                await zygote.wait()
            server.close()
            await server.wait_closed()
    assert code == 0, log.read_text()[-3000:]


async def drop_redis_keys(redis_url: str, resource: str) -> None:
    """Delete the Redis keys of every lock on ``resource`` (a unique name), in any mode."""
    async with aioredis.Redis.from_url(redis_url) as client:
        keys = [k async for k in client.scan_iter(match=f"*{resource}*")]
        if keys:
            await client.delete(*keys)
