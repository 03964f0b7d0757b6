"""``headway demo ratelimit``: two clients burst against a rate-limited Starlette app.

Requests go straight through the ASGI app in this process (no server, no
HTTP client library); the limiter runs on the in-memory backend with a fake
clock, so the scene shows the same numbers every time and never waits.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway._clock import FakeClock
from headway._http import ASGIApp, Message
from headway.ratelimit.backends.memory import MemoryRateLimitBackend
from headway.ratelimit.http.middleware import RateLimitMiddleware
from headway.ratelimit.http.rules import LimiterSettings, Rule
from headway.ratelimit.policies import FixedWindow, TokenBucket

#: Prints one line of a demo scene (the demos' only output).
Say = Callable[[str], None]


async def _get(app: ASGIApp, path: str, ip: str) -> tuple[int, dict[str, str], bytes]:
    """One GET request from ``ip``, answered by ``app``: status, headers, body."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": [(b"host", b"demo")], "client": (ip, 50000),
        "server": ("demo", 80),
    }  # fmt: skip
    start: Message = {}
    body = bytearray()

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        else:
            body.extend(message.get("body", b""))

    await app(scope, receive, send)
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, bytes(body)


def _app(clock: FakeClock) -> Starlette:
    async def hello(request: Request) -> Response:
        return JSONResponse({"hello": "world"})

    rule = Rule(
        {"burst": TokenBucket(capacity=3, rate=1, period=2.0), "minute": FixedWindow(20, 60)},
        name="api",
    )
    middleware = Middleware(
        RateLimitMiddleware,
        rules=[rule],
        backend=MemoryRateLimitBackend(clock=clock),
        limiter=LimiterSettings(clock=clock),
    )
    return Starlette(routes=[Route("/hello", hello)], middleware=[middleware])


async def ratelimit_scene(say: Say) -> None:
    """A burst from two clients: their headers, a 429 and its Retry-After, then recovery."""
    say("== ratelimit: 3 at once then 1 every 2 s, and 20 a minute, per client address ==")
    clock = FakeClock(1000.0)
    app = _app(clock)
    burst = [("alice", "192.0.2.10")] * 4 + [("bob", "198.51.100.7")] * 2
    refused: tuple[dict[str, str], bytes] | None = None
    for i, (name, ip) in enumerate(burst):
        status, headers, body = await _get(app, "/hello", ip)
        if i == 0:
            say(f"  every response carries RateLimit-Policy: {headers['ratelimit-policy']}")
        say(f"  {name:<5} GET /hello -> {status}  RateLimit: {headers['ratelimit']}")
        if status == 429 and refused is None:
            refused = headers, body
    assert refused is not None
    headers, body = refused
    problem = json.loads(body)
    say("")
    say("  alice's refusal:")
    say(f"    Retry-After: {headers['retry-after']}   Cache-Control: {headers['cache-control']}")
    say(f"    Content-Type: {headers['content-type']}")
    say(f"    {problem['title']}: {problem['detail']}")
    say(f"    violated-policies: {problem['violated-policies']}")
    wait = int(headers["retry-after"])
    clock.advance(wait)
    say(f"  ... {wait} s later (a fake clock: the demo does not wait) ...")
    status, headers, _ = await _get(app, "/hello", "192.0.2.10")
    say(f"  alice GET /hello -> {status}  RateLimit: {headers['ratelimit']}")
