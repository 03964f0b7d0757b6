"""The rate-limit middleware's and decorator's own cost, per request, on the in-memory backend.

    uv run python benchmarks/middleware_cost.py                  # CPU time and loop turns
    uv run python benchmarks/middleware_cost.py --instructions   # + callgrind instruction counts
    uv run python benchmarks/middleware_cost.py --url redis://127.0.0.1:6379/7   # + turns on Redis

Requests go straight through the ASGI app (no server, no client), one at a time,
every one admitted. For each subject: the process CPU time per request (the
lowest and the median of several rounds: CPU time, not wall time, so other
processes on the machine move it less), the event-loop turns per request
(counted by wrapping the loop's ``_run_once``), and with ``--instructions`` the
instructions per request, counted by valgrind's callgrind between two dumps, which
load does not change at all. "Own cost" is a subject's cost minus the bare app's
and minus one in-memory decision (``RateLimiter.hit`` alone). With ``--url``, the
loop turns of the middleware and of a lone decision on that Redis, side by side:
what the middleware adds to the decision's own awaits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from headway import FixedWindow, RateLimiter, RateLimitMiddleware, Rule, rate_limit

HUGE = 500_000  # per hour: never reached

SCOPE: dict[str, Any] = {
    "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
    "method": "GET", "scheme": "http", "path": "/ping", "raw_path": b"/ping", "root_path": "",
    "query_string": b"", "headers": [(b"host", b"bench"), (b"accept", b"*/*")],
    "client": ("127.0.0.1", 50000), "server": ("bench", 80),
}  # fmt: skip


async def ping() -> dict[str, bool]:
    return {"ok": True}


def bare() -> Any:
    app = FastAPI()
    app.get("/ping")(ping)
    return app


def middleware() -> Any:
    app = bare()
    app.add_middleware(RateLimitMiddleware, rules=[Rule(FixedWindow(HUGE, 3600.0))])
    return app


def decorator() -> Any:
    app = FastAPI()
    app.get("/ping")(rate_limit(FixedWindow(HUGE, 3600.0))(ping))
    return app


def decision() -> Any:
    """One in-memory decision and nothing else, called like an app."""
    limiter = RateLimiter(FixedWindow(HUGE, 3600.0))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await limiter.hit("default/ip@127.0.0.1")

    return app


SUBJECTS: dict[str, Callable[[], Any]] = {
    "bare FastAPI app": bare,
    "RateLimitMiddleware": middleware,
    "@rate_limit": decorator,
    "RateLimiter.hit alone": decision,
}


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def send(message: dict[str, Any]) -> None:
    if message["type"] == "http.response.start":
        assert message["status"] == 200, message


async def call(app: Any) -> None:
    await app(dict(SCOPE), receive, send)


async def cpu(app: Any, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        await call(app)
    return (time.process_time() - start) / n


async def turns(app: Any, n: int = 500) -> float:
    loop = asyncio.get_running_loop()
    count = 0
    run_once = loop._run_once  # type: ignore[attr-defined]

    def counting() -> None:
        nonlocal count
        count += 1
        run_once()

    loop._run_once = counting  # type: ignore[attr-defined]
    try:
        for _ in range(n):
            await call(app)
    finally:
        loop._run_once = run_once  # type: ignore[attr-defined]
    return count / n


def dump(label: str) -> None:
    """Ask callgrind (we run under it) to write the counts since the last dump."""
    subprocess.run(["callgrind_control", "-d", label, str(os.getpid())], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


async def under_callgrind(n: int) -> None:
    for index, build in enumerate(SUBJECTS.values()):
        app = build()
        for _ in range(300):
            await call(app)
        dump("warm-up")
        for _ in range(n):
            await call(app)
        dump(f"subject-{index}")


def instructions(n: int) -> dict[str, float]:
    """Re-run this script under callgrind; instructions per request for each subject."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("--instructions needs valgrind (callgrind_control) on PATH")
    with tempfile.TemporaryDirectory() as out:
        argv = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p",
            sys.executable, __file__, "--inside-callgrind", str(n),
        ]  # fmt: skip
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        names = list(SUBJECTS)
        found: dict[str, float] = {}
        for path in Path(out).iterdir():
            lines = path.read_text(errors="replace").splitlines()
            label = next((ln for ln in lines if ln.startswith("desc: Trigger")), "")
            total = next(ln for ln in lines if ln.startswith(("summary:", "totals:")))
            if "subject-" in label:
                found[names[int(label.rsplit("subject-", 1)[1])]] = int(total.split()[1]) / n
        return found


async def redis_turns(url: str) -> dict[str, float]:
    from redis import asyncio as aioredis

    from headway import RedisRateLimitBackend

    client = aioredis.Redis.from_url(url)
    backend = RedisRateLimitBackend(client)
    limiter = RateLimiter(FixedWindow(HUGE, 3600.0), backend=backend)

    async def hit(scope: Any, receive: Any, send: Any) -> None:
        await limiter.hit("bench-cost/ip@127.0.0.1")

    app = bare()
    app.add_middleware(
        RateLimitMiddleware, rules=[Rule(FixedWindow(HUGE, 3600.0), name="bench-cost")],
        backend=backend,
    )  # fmt: skip
    found = {}
    for name, subject in (("RateLimiter.hit on Redis", hit), ("RateLimitMiddleware on Redis", app)):
        for _ in range(100):
            await call(subject)
        found[name] = await turns(subject)
    await client.delete(*await client.keys("headway:{rl:bench-cost*"))
    await client.aclose()
    return found


async def measure(n: int, rounds: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    apps = {name: build() for name, build in SUBJECTS.items()}
    for app in apps.values():
        for _ in range(300):
            await call(app)
    loop_turns = {name: await turns(app) for name, app in apps.items()}
    times: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(rounds):
        for name, app in apps.items():
            times[name].append(await cpu(app, n))
    return times, loop_turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instructions", action="store_true", help="also count instructions")
    parser.add_argument("--requests", type=int, default=5000, help="per subject and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", help="also count loop turns against this Redis")
    parser.add_argument("--inside-callgrind", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside_callgrind:
        asyncio.run(under_callgrind(args.inside_callgrind))
        return
    times, loop_turns = asyncio.run(measure(args.requests, args.rounds))
    counted = instructions(1000) if args.instructions else {}
    low = {name: min(t) for name, t in times.items()}
    base, alone = "bare FastAPI app", "RateLimiter.hit alone"
    print("| subject | CPU µs/request (lowest) | median | loop turns | instructions/request |")
    print("|---|---:|---:|---:|---:|")
    for name, samples in times.items():
        median = sorted(samples)[len(samples) // 2]
        ins = f"{counted[name]:,.0f}" if name in counted else "—"
        print(f"| {name} | {low[name] * 1e6:.1f} | {median * 1e6:.1f} | "
              f"{loop_turns[name]:.2f} | {ins} |")  # fmt: skip
    print()
    for name in ("RateLimitMiddleware", "@rate_limit"):
        own = (low[name] - low[base] - low[alone]) * 1e6
        line = f"{name}: own cost {own:.1f} µs CPU"
        if counted:
            line += f", {counted[name] - counted[base] - counted[alone]:,.0f} instructions"
        print(line + " per request (beyond the bare app and one in-memory decision)")
    if args.url:
        print()
        for name, count in asyncio.run(redis_turns(args.url)).items():
            print(f"{name}: {count:.2f} loop turns per request")


if __name__ == "__main__":
    main()
