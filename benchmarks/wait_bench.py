"""Wait instead of refuse (issue 30): 200 concurrent requests on a 10/s limit, ``max_wait=30``.

The middleware in front of a small Starlette app, its requests sent as ASGI calls at once
(one task each, in arrival order), on Redis through ``RedisRateLimitBackend.from_url``
(or the in-memory backend with ``--memory``). The limit is ``TokenBucket(10, 10)``: ten
at once, then one every 100 ms. Prints how many were admitted and refused, whether they
were admitted in arrival order, the most admitted in any window against what the bucket
allows, and how late each admission was against the ideal schedule (request ``i`` at
``max(0, (i - 9) / 10)`` s). Then the same with ``max_waiting=50``.

    ./run.sh python benchmarks/wait_bench.py --url redis://127.0.0.1:6384/3
    ./run.sh python benchmarks/wait_bench.py --memory
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import itertools
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from headway import (
    MemoryRateLimitBackend,
    RateLimitBackend,
    RateLimitEvent,
    RateLimitMiddleware,
    RedisRateLimitBackend,
    Rule,
    TokenBucket,
)

ARRIVAL: contextvars.ContextVar[int] = contextvars.ContextVar("arrival")
BURST, RATE, REQUESTS = 10, 10, 200


async def ok(request: Request) -> Response:
    return PlainTextResponse("ok")


def scope() -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/", "raw_path": b"/", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"bench")], "client": ("192.0.2.1", 40000),
        "server": ("bench", 80),
    }  # fmt: skip


async def one_run(backend: RateLimitBackend, max_waiting: int) -> None:
    events: list[tuple[int, str, float]] = []

    def record(event: RateLimitEvent) -> None:
        events.append((ARRIVAL.get(), event.outcome, time.monotonic()))

    middleware = RateLimitMiddleware(
        Starlette(routes=[Route("/", ok)]),
        rules=[Rule(TokenBucket(BURST, RATE), name="api")],
        backend=backend, max_wait=30, max_waiting=max_waiting, on_decision=record,
    )  # fmt: skip
    statuses: list[int] = []

    async def request(n: int) -> None:
        ARRIVAL.set(n)
        done = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if not done.is_set():
                done.set()
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # the client never leaves
            raise AssertionError

        async def send(message: Any) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await middleware(scope(), receive, send)

    started = time.monotonic()
    await asyncio.gather(*(request(n) for n in range(REQUESTS)))
    elapsed = time.monotonic() - started
    admitted = [(n, t - started) for n, o, t in events if o == "allowed"]
    order = [n for n, _ in admitted]
    times = [t for _, t in admitted]
    worst = max(
        (j - i + 1) - (BURST + RATE * (late - early))
        for (i, early), (j, late) in itertools.combinations(enumerate(times), 2)
    )
    lateness = [t - max(0.0, (i - BURST + 1) / RATE) for i, t in enumerate(times)]
    print(
        f"max_waiting={max_waiting}: {len(admitted)} admitted, "
        f"{sum(s == 429 for s in statuses)} refused, in {elapsed:.2f} s; "
        f"in arrival order: {order == sorted(order)}; "
        f"most admissions past the bucket's allowance in any window: {max(worst, 0):.2f}; "
        f"lateness against the ideal schedule: median {sorted(lateness)[len(lateness) // 2]:.3f} s,"
        f" max {max(lateness):.3f} s"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a Redis URL whose database may be flushed")
    where.add_argument("--memory", action="store_true", help="the in-memory backend")
    args = parser.parse_args()
    for max_waiting in (200, 50):
        if args.memory:
            await one_run(MemoryRateLimitBackend(), max_waiting)
            continue
        backend = RedisRateLimitBackend.from_url(args.url)
        await backend.client.flushdb()
        try:
            await one_run(backend, max_waiting)
        finally:
            await backend.aclose()


if __name__ == "__main__":
    asyncio.run(main())
