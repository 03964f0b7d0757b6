"""WebSocket message limits behind a real uvicorn server, with a real client (``websockets``),
on memory and on Redis (``RedisRateLimitBackend.from_url``)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
from redis import asyncio as aioredis
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from websockets.exceptions import InvalidStatus

from headway import (
    ClientAddress,
    Concurrency,
    FakeClock,
    FixedWindow,
    LimiterSettings,
    MemoryRateLimitBackend,
    RateLimitBackend,
    RedisRateLimitBackend,
    TokenBucket,
    WebSocketRateLimitMiddleware,
    WebSocketRule,
)
from headway.ratelimit.http.rules import Limits
from tests.ratelimit.http.server import serving
from tests.ratelimit.http.websocket_apps import (
    Recorder,
    client,
    closed_with,
    send_all,
    websocket_app,
)
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[RateLimitBackend]:
    """The in-memory backend, and Redis as a user connects to it (``from_url``)."""
    if request.param == "memory":
        yield MemoryRateLimitBackend()
        return
    url: str = request.getfixturevalue("redis_url")
    flushing = aioredis.Redis.from_url(url)
    await flushing.flushdb()  # a clean database, as the ``redis_client`` fixture leaves it
    await flushing.aclose()
    redis_backend = RedisRateLimitBackend.from_url(url)
    try:
        yield redis_backend
    finally:
        await redis_backend.aclose()


#: uvicorn's websockets-sans-I/O protocol logs this after every denial response, which
#: never marks its handshake complete (Kludex/uvicorn#3138, open): the client got the 429.
UVICORN_DENIAL_NOISE = "ASGI callable returned without completing handshake."


@pytest.fixture(autouse=True)
def no_app_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No test may leave an error in the server's log (an app crashing on a closed socket)."""
    server_log = logging.getLogger("uvicorn")  # it does not propagate to the root
    server_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO):
            yield
    finally:
        server_log.removeHandler(caplog.handler)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert [e for e in errors if e != UVICORN_DENIAL_NOISE] == []


@pytest.mark.parametrize("relayed", [False, True], ids=["inline", "relayed"])
async def test_messages_over_the_limit_never_reach_the_app(
    backend: RateLimitBackend, relayed: bool
) -> None:
    recorder = Recorder()
    window = FixedWindow(5, NO_ROLLOVER)
    # A connection holding a slot is relayed by a task; one without is charged inline.
    policies: Limits = {"msgs": window, "conns": Concurrency(4)} if relayed else window
    rule = WebSocketRule(policies, name="msgs")
    app = websocket_app(recorder, rules=[rule], backend=backend)
    messages = [f"m{i}" for i in range(20)]
    with anyio.fail_after(10):
        async with serving(app) as url, client(url) as websocket:
            await send_all(websocket, messages)
            code = await closed_with(websocket)
            app_code = await recorder.ended.get()
    assert code == 1008  # what the client sees: policy violation
    assert recorder.received["-"] == messages[:5]  # exactly the admitted ones, in order
    assert app_code == 1008  # the app's receive gave it the same code
    assert recorder.late == [1006]  # its send after it failed as on any closed socket


async def test_a_byte_policy_charges_payload_sizes(backend: RateLimitBackend) -> None:
    recorder = Recorder()
    rule = WebSocketRule(FixedWindow(100, NO_ROLLOVER), unit="byte", name="bytes")
    app = websocket_app(recorder, rules=[rule], backend=backend)
    text = "é" * 15  # 15 characters, 30 bytes in UTF-8
    with anyio.fail_after(10):
        async with serving(app) as url, client(url) as websocket:
            # 90 bytes, then 10 (100: the whole quota), then 1 byte over it.
            await send_all(websocket, [text, text, text, b"x" * 10, b"y", "never"])
            code = await closed_with(websocket)
            await recorder.ended.get()
        async with serving(app) as url, client(url, name="big") as websocket:
            await send_all(websocket, ["z" * 101])  # larger than the limit itself
            big = await closed_with(websocket)
    assert code == big == 1008
    assert recorder.received["-"] == [text, text, text, b"x" * 10]
    assert recorder.received["big"] == []


async def test_waiting_messages_arrive_in_order_within_the_bound(
    backend: RateLimitBackend,
) -> None:
    recorder = Recorder()
    # A burst of 2, then one message every 50 ms.
    rule = WebSocketRule(TokenBucket(2, 20, 1.0), over="wait", max_wait=1.0, name="paced")
    app = websocket_app(recorder, rules=[rule], backend=backend)
    messages = [f"m{i}" for i in range(8)]
    with anyio.fail_after(10):
        async with serving(app) as url, client(url) as websocket:
            started = time.monotonic()
            assert await send_all(websocket, [*messages, "count"]) == 9
            answer = await websocket.recv()  # sent once all nine went through
            elapsed = time.monotonic() - started
    assert answer == "9"
    assert recorder.received["-"] == [*messages, "count"]  # none lost, none reordered
    # Seven of them waited for a refill, 50 ms each: the limiter held them.
    assert elapsed >= 7 * 0.05 * 0.9


async def test_a_message_that_cannot_be_admitted_in_time_closes_at_once(
    backend: RateLimitBackend,
) -> None:
    recorder = Recorder()
    # A burst of 2, then one message every 10 s: the third cannot be admitted in 2 s.
    rule = WebSocketRule(TokenBucket(2, 1, 10.0), over="wait", max_wait=2.0, name="slow")
    app = websocket_app(recorder, rules=[rule], backend=backend)
    with anyio.fail_after(10):
        async with serving(app) as url, client(url) as websocket:
            started = time.monotonic()
            await send_all(websocket, ["a", "b", "c", "d"])
            code = await closed_with(websocket)
            elapsed = time.monotonic() - started
    assert code == 1008
    assert recorder.received["-"] == ["a", "b"]
    assert elapsed < 1.5  # it did not wait out a bound it could not meet


async def test_connections_per_identity_and_slots_freed_however_a_socket_closes(
    backend: RateLimitBackend,
) -> None:
    recorder = Recorder()
    rule = WebSocketRule({"conns": Concurrency(2, ttl=10.0)}, name="conns")
    app = websocket_app(recorder, rules=[rule], backend=backend)
    with anyio.fail_after(15):
        async with serving(app) as url, client(url) as first, client(url) as second:
            with pytest.raises(InvalidStatus) as refused:
                async with client(url):
                    pass
            assert refused.value.response.status_code == 429  # the denial response
            assert recorder.accepted == 2  # the third handshake never reached the app
            await first.close()  # a clean close (1000)...
            assert await recorder.ended.get() == 1000  # ...relayed after its slot's release
            async with client(url) as third:
                second.transport.abort()  # an abnormal end: no close frame
                assert await recorder.ended.get() in {1005, 1006}  # uvicorn: 1005 once accepted
                async with client(url):
                    with pytest.raises(InvalidStatus):  # two held again: the third, this one
                        async with client(url):
                            pass
                await third.close()
            # A handler that never reads: its client's departure still frees the slot.
            async with client(url, "/push") as pushed, client(url, "/push"):
                pushed.transport.abort()
                await _admitted_soon(url)
                recorder.release_push.set()
    assert recorder.accepted == 7


async def _admitted_soon(url: str) -> None:
    """Connect until admitted (the server notices an aborted socket asynchronously)."""
    while True:
        try:
            async with client(url):
                return
        except InvalidStatus as exc:
            status = exc.response.status_code
        assert status == 429
        await anyio.sleep(0.02)


async def test_a_connection_whose_slot_lease_is_lost_is_closed_with_1013() -> None:
    recorder = Recorder()
    clock = FakeClock()
    rule = WebSocketRule({"conns": Concurrency(1, ttl=0.3)}, name="conns")
    app = websocket_app(recorder, rules=[rule], backend=MemoryRateLimitBackend(clock=clock))
    with anyio.fail_after(10):
        async with serving(app) as url, client(url, "/push") as websocket:
            clock.advance(60)  # the lease ends under the handler: its next renewal is refused
            code = await closed_with(websocket)
            async with client(url, "/push"):  # the slot is free again
                recorder.release_push.set()
    assert code == 1013
    assert recorder.accepted == 2


async def test_identities_have_their_own_budgets_and_a_header_is_not_one(
    backend: RateLimitBackend,
) -> None:
    recorder = Recorder()
    rules = [
        # The default identity: the socket peer, whatever the headers say.
        WebSocketRule(FixedWindow(3, NO_ROLLOVER), name="peer", routes=["/ws"]),
        # A rule trusting one proxy: the header names the client.
        WebSocketRule(
            FixedWindow(3, NO_ROLLOVER),
            name="proxied",
            routes=["/trusted"],
            identity=ClientAddress(trusted_hops=1),
        ),
    ]
    app = websocket_app(recorder, rules=rules, backend=backend)

    def forwarded(address: str) -> dict[str, str]:
        return {"x-forwarded-for": address}

    with anyio.fail_after(10):
        # uvicorn itself rewrites the peer from X-Forwarded-For when it comes from
        # 127.0.0.1 (``forwarded_allow_ips``); a server facing clients directly must not.
        async with serving(app, proxy_headers=False) as url:
            async with client(url, name="one") as websocket:
                await send_all(websocket, ["1", "2", "3", "4"])
                assert await closed_with(websocket) == 1008
            async with client(url, name="two", source="127.0.0.2") as websocket:
                await send_all(websocket, ["1", "2", "count"])
                assert await websocket.recv() == "3"  # a budget of its own
            async with client(url, name="spoof", headers=forwarded("203.0.113.9")) as websocket:
                await send_all(websocket, ["1"])
                assert await closed_with(websocket) == 1008  # the peer's budget is spent
            # Where the rule trusts the header, each address it names has a budget.
            for name, address in [("a", "203.0.113.1"), ("b", "203.0.113.2")]:
                headers = forwarded(address)
                async with client(url, "/trusted", name=name, headers=headers) as websocket:
                    await send_all(websocket, ["1", "2", "3", "4"])
                    assert await closed_with(websocket) == 1008
    assert recorder.received == {
        "one": ["1", "2", "3"],
        "two": ["1", "2", "count"],
        "spoof": [],
        "a": ["1", "2", "3"],
        "b": ["1", "2", "3"],
    }


async def test_a_rule_failing_closed_closes_with_1013() -> None:
    recorder = Recorder()
    down = RedisRateLimitBackend.from_url("redis://127.0.0.1:1", timeout=0.2)  # nothing listens
    rule = WebSocketRule(FixedWindow(5, NO_ROLLOVER), fail="closed")
    app = websocket_app(recorder, rules=[rule], backend=down, limiter=LimiterSettings(budget=0.2))
    with anyio.fail_after(10):
        async with serving(app) as url, client(url) as websocket:
            await send_all(websocket, ["a"])
            code = await closed_with(websocket)
    await down.aclose()
    assert code == 1013  # try again later: the limit could not be checked
    assert recorder.received["-"] == []


async def test_http_passes_through_untouched() -> None:
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hi")

    rule = WebSocketRule(FixedWindow(1, NO_ROLLOVER))
    app = Starlette(
        routes=[Route("/", hello)],
        middleware=[Middleware(WebSocketRateLimitMiddleware, rules=[rule])],
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        statuses = [(await http.get("/")).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]


def test_bad_rules_are_refused_clearly() -> None:
    window = FixedWindow(5, 60)
    with pytest.raises(ValueError, match="unit"):
        WebSocketRule(window, unit="octets")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="over"):
        WebSocketRule(window, over="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_wait"):
        WebSocketRule(window, max_wait=-1)
    with pytest.raises(TypeError, match="not a function"):
        WebSocketRule(lambda scope: window)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name"):
        WebSocketRule(window, name="no spaces")
    with pytest.raises(TypeError, match="list"):
        WebSocketRateLimitMiddleware(None, rules=WebSocketRule(window))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unique"):
        WebSocketRateLimitMiddleware(
            None,  # type: ignore[arg-type]
            rules=[WebSocketRule(window), WebSocketRule(FixedWindow(9, 60))],
        )


@pytest.mark.redis
async def test_the_redis_quota_is_in_redis(redis_client: aioredis.Redis, redis_url: str) -> None:
    backend = RedisRateLimitBackend.from_url(redis_url)
    recorder = Recorder()
    rule = WebSocketRule(FixedWindow(2, NO_ROLLOVER), name="stored")
    app = websocket_app(recorder, rules=[rule], backend=backend)
    with anyio.fail_after(10):
        async with serving(app) as url, client(url) as websocket:
            await send_all(websocket, ["a", "b", "c"])
            assert await closed_with(websocket) == 1008
    await backend.aclose()
    keys = await redis_client.keys("*stored*")
    assert keys
    assert all(ttl > 0 for ttl in [await redis_client.pttl(key) for key in keys])
