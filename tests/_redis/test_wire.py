"""headway's own pipelined connection (``Wire``, ``Wires``), against real Redis servers."""

from __future__ import annotations

import asyncio
import os
import signal
import warnings
from typing import Any

import pytest
from redis import asyncio as aioredis
from redis import exceptions as redis_errors

from headway._redis import wire as wire_module
from headway._redis.resp import Arg
from headway._redis.scripts import Script
from headway._redis.wire import Wire, Wires
from tests.redis_observed import commands_run
from tests.servers import RedisServers

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


@pytest.fixture(params=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    """Both loops: the transport is taken over from redis-py, where loops differ."""
    return ("asyncio", {"use_uvloop": request.param == "uvloop"})


ECHO = Script.from_source("echo", "return {KEYS[1], ARGV[1]}")
INCR = Script.from_source("incr", "return redis.call('INCR', KEYS[1])")
FAIL = Script.from_source("fail", "return redis.error_reply('BOOM went the script')")


@pytest.fixture
async def wires(redis_client: aioredis.Redis) -> Any:
    wires = Wires(redis_client)
    yield wires
    await wires.aclose()


async def test_concurrent_calls_each_get_their_own_reply(wires: Wires) -> None:
    await wires.call(ECHO, ["warm"], [0])  # connected, the script cached
    wire = wires.wire()
    requests, writes = wire.requests, wire.writes
    replies = await asyncio.gather(*(wires.call(ECHO, [f"k{i}"], [i]) for i in range(2000)))
    assert replies == [[f"k{i}".encode(), str(i).encode()] for i in range(2000)]
    assert wire.requests - requests == 2000
    assert wire.writes - writes <= 10  # calls made while others were in flight shared writes


async def test_arguments_are_encoded_as_redis_py_encodes_them(wires: Wires) -> None:
    cases: list[tuple[Arg, bytes]] = [
        ("é", "é".encode()),
        (b"\x00\xff", b"\x00\xff"),
        (7, b"7"),
        (0.5, b"0.5"),
    ]
    for value, sent in cases:
        assert await wires.call(ECHO, ["k"], [value]) == [b"k", sent]
    with pytest.raises(redis_errors.DataError):
        await wires.call(ECHO, ["k"], [True])


async def test_error_replies_raise_and_the_connection_goes_on(wires: Wires) -> None:
    with pytest.raises(redis_errors.ResponseError, match="BOOM"):
        await wires.call(FAIL, ["k"], [])
    assert await wires.call(INCR, ["n"], []) == 1


async def test_a_flushed_library_is_loaded_again_on_the_same_call(
    wires: Wires, redis_client: aioredis.Redis
) -> None:
    assert await wires.call(INCR, ["n"], []) == 1
    await redis_client.function_flush()
    assert await asyncio.gather(*(wires.call(INCR, ["n"], []) for _ in range(5))) == [2, 3, 4, 5, 6]


async def test_a_reply_nobody_waits_for_goes_to_the_orphan(
    wires: Wires, redis_client: aioredis.Redis
) -> None:
    await wires.call(INCR, ["warm"], [])  # connected: calls are written before any await
    for turns in range(3):
        orphaned: list[Any] = []
        # Writes paused: the call is sent but not answered until we unpause, however
        # fast the server (a reply inside the loop turns below would not be orphaned).
        await redis_client.client_pause(10_000, all=False)
        task = asyncio.create_task(wires.call(INCR, ["n"], [], orphaned.append))
        for _ in range(turns + 1):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await redis_client.client_unpause()
        # Calls on one connection run in order: once this one is answered, so was that one.
        n = await wires.call(INCR, ["n"], [])
        assert orphaned == [n - 1]


async def test_a_stalled_server_is_dropped_after_socket_timeout(
    redis_servers: RedisServers,
) -> None:
    server = redis_servers.start()
    client = aioredis.Redis(port=server.port, socket_timeout=0.3)
    wires = Wires(client)
    try:
        assert await wires.call(INCR, ["n"], []) == 1
        os.kill(server.pid, signal.SIGSTOP)
        try:
            with pytest.raises(redis_errors.ConnectionError):
                await asyncio.wait_for(wires.call(INCR, ["n"], []), 5)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        # The stalled call ran once the server resumed, on the dropped socket or not.
        assert await wires.call(INCR, ["n"], []) in (2, 3)
    finally:
        await wires.aclose()
        await client.aclose()
        redis_servers.stop(server)


async def test_a_lost_connection_fails_calls_in_flight_and_the_next_call_reconnects(
    redis_servers: RedisServers,
) -> None:
    server = redis_servers.start()
    client = aioredis.Redis(port=server.port)
    wires = Wires(client)
    try:
        assert await wires.call(INCR, ["n"], []) == 1
        os.kill(server.pid, signal.SIGSTOP)  # the next call stays in flight ...
        in_flight = asyncio.ensure_future(wires.call(INCR, ["n"], []))
        await asyncio.sleep(0.05)
        assert not in_flight.done()
        redis_servers.stop(server)  # ... until the server dies under it
        with pytest.raises(redis_errors.ConnectionError):
            await in_flight
        server = redis_servers.start(port=server.port)  # nothing kept: counters start over
        assert await wires.call(INCR, ["n"], []) == 1  # a new connection; NOSCRIPT recovered
    finally:
        await wires.aclose()
        await client.aclose()
        redis_servers.stop(server)


async def test_closing_the_client_closes_the_connection_cleanly(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    wires = Wires(client)
    await wires.call(INCR, ["wire-close"], [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await client.aclose()  # the pool closes the connection we drive, too
        assert not wires.wire().ready
        await wires.call(INCR, ["wire-close"], [])  # and a later call reconnects
        await wires.aclose()
        await client.delete("wire-close")
        await client.aclose()


async def test_disabled_or_unsupported_calls_go_through_redis_py(
    redis_client: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = commands_run(redis_url)
    disabled = Wires(redis_client, enabled=False)
    assert await disabled.call(INCR, ["n"], []) == 1

    def refuse(wire: Wire, borrowed: Any) -> None:
        return None  # as for a connection without the stream attributes we take over

    monkeypatch.setattr(wire_module, "take_over", refuse)
    wire = Wire(redis_client, asyncio.get_running_loop())
    assert await wire.call(INCR, ["n"], []) == 2
    assert not wire.supported
    assert await wire.call(INCR, ["n"], []) == 3
    # redis-py's EVALSHA (EVAL while the script is not cached), never headway's FCALL.
    ran = commands_run(redis_url) - before
    assert (ran["fcall"], ran["evalsha"] + ran["eval"]) == (0, 3)


async def test_a_call_times_out_and_its_late_reply_goes_to_the_orphan(
    redis_servers: RedisServers,
) -> None:
    server = redis_servers.start()
    client = aioredis.Redis(port=server.port)  # no socket timeout: the socket is kept
    wires = Wires(client)
    try:
        assert await wires.call(INCR, ["n"], []) == 1
        orphaned: list[Any] = []
        os.kill(server.pid, signal.SIGSTOP)
        try:
            with pytest.raises(redis_errors.TimeoutError):
                await wires.call(INCR, ["n"], [], orphaned.append, timeout=0.2)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert await wires.call(INCR, ["n"], [], timeout=5) == 3  # the same connection
        assert orphaned == [2]
    finally:
        await wires.aclose()
        await client.aclose()
        redis_servers.stop(server)
