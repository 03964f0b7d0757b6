"""Script calls as Redis functions: loaded when missing, EVALSHA where functions are refused."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis import asyncio as aioredis

import headway
from headway import (
    Concurrency,
    ConcurrencyLimiter,
    FixedWindow,
    Lock,
    RateLimiter,
    RedisLockBackend,
    RedisRateLimitBackend,
    Source,
)
from headway._redis.scripts import Script
from headway._redis.sync_wire import SyncWire
from headway._redis.wire import Wires
from headway.lock.backends.redis import keys as lock_scripts
from headway.lock.backends.redis import mode_keys as mode_scripts
from headway.lock.backends.redis.keys import lock_keys
from headway.lock.backends.redlock import backend as redlock
from headway.ratelimit.algorithms import ALGORITHMS, Algorithm, PolicySet
from headway.ratelimit.backends import redis_scripts
from headway.ratelimit.backends.redis_scripts import (
    decide_script,
    lease_script,
    reserve_script,
    settle_script,
)
from headway.ratelimit.lease_model import NotLeased
from headway.ratelimit.policies import Policy
from headway.ratelimit.slots import slot_key
from tests.servers import RedisServers, Server
from tests.windows import NO_ROLLOVER

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

INCR = Script.from_source("incr", "return redis.call('INCR', KEYS[1])")
# Included code runs once, when the library loads: a call sees what earlier calls left.
COUNTER = Script.__new__(Script)
COUNTER._set("counter", "local calls = 0", "calls = calls + 1 return calls")


@pytest.fixture
def server(redis_servers: RedisServers) -> Iterator[Server]:
    """A server of our own: its functions, scripts and users are changed here."""
    server = redis_servers.start()
    try:
        yield server
    finally:
        redis_servers.stop(server)


def _user(server: Server, *rules: str) -> None:
    admin = redis.Redis(port=server.port)
    admin.acl_setuser("app", enabled=True, nopass=True, keys=["*"], commands=["+@all", *rules])
    admin.close()


def _commands(server: Server) -> dict[str, int]:
    admin = redis.Redis(port=server.port)
    stats = admin.info("commandstats")
    admin.close()
    sent = ("fcall", "function|load", "evalsha", "eval")
    calls = {c: stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in sent}
    return {c: n for c, n in calls.items() if n}  # a refused command counts no call


async def test_a_call_is_an_fcall_and_a_flushed_library_is_loaded_on_the_same_call(
    server: Server,
) -> None:
    client = aioredis.Redis(port=server.port)
    wires = Wires(client)
    assert await wires.call(INCR, ["n"], []) == 1  # not found, loaded, called again
    await client.function_flush()
    assert await asyncio.gather(*(wires.call(INCR, ["n"], []) for _ in range(5))) == [2, 3, 4, 5, 6]
    assert await wires.call(INCR, ["n"], []) == 7
    assert wires.wire().functions
    # 7 calls, each found its function but the first and the five after the flush; the
    # five in flight together loaded the library once.
    assert _commands(server) == {"fcall": 7 + 6, "function|load": 2}
    libraries = await client.function_list()  # [[b"library_name", name, ...]]
    assert [library[1] for library in libraries] == [INCR.function.encode()]
    await wires.aclose()
    await client.aclose()


async def test_included_code_runs_once_per_load(server: Server) -> None:
    client = aioredis.Redis(port=server.port)
    wires = Wires(client)
    assert [await wires.call(COUNTER, [], []) for _ in range(3)] == [1, 2, 3]
    await wires.aclose()
    await client.aclose()


async def test_without_functions_calls_are_evalshas(server: Server) -> None:
    _user(server, "-fcall", "-function")
    client = aioredis.Redis(port=server.port, username="app")
    wires = Wires(client)
    assert await wires.call(INCR, ["n"], []) == 1  # FCALL refused, EVALSHA: NOSCRIPT, EVAL
    assert not wires.wire().functions
    await client.script_flush()
    assert await asyncio.gather(*(wires.call(INCR, ["n"], []) for _ in range(3))) == [2, 3, 4]
    assert _commands(server) == {"evalsha": 4, "eval": 4}
    await wires.aclose()
    await client.aclose()


def test_sync_calls_load_the_library_or_fall_back(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis(port=server.port)
    wire = SyncWire(client)
    assert wire.call(INCR, ["n"], []) == 1
    client.function_flush()
    assert wire.call(INCR, ["n"], []) == 2
    assert wire.functions
    assert _commands(server) == {"fcall": 4, "function|load": 2}
    wire.close()
    # A user who may call functions but not load them: the refused load is logged.
    _user(server, "-function|load")
    client.function_flush()
    refused = SyncWire(redis.Redis(port=server.port, username="app"))
    with caplog.at_level(logging.WARNING, logger="headway"):
        assert refused.call(INCR, ["n"], []) == 3
    assert not refused.functions
    assert "did not load headway's function library" in caplog.text
    refused.close()
    client.close()


def _policy(algorithm: Algorithm) -> Policy:
    hints = typing.get_type_hints(algorithm.policy)
    fields = [f.name for f in dataclasses.fields(algorithm.policy) if f.name != "on_error"]
    values: list[Any] = [1.0 if hints[name] is float else 1 for name in fields]
    return algorithm.policy(*values)


def _every_script() -> list[Script]:
    """Every script headway sends, once each: locks, lock modes (semaphores: concurrency
    slots too), and each algorithm's decide, lease, reserve and settle, alone and all
    together."""
    fixed = {
        script.function: script  # ``redlock`` sends some of the lock's own scripts
        for module in (lock_scripts, mode_scripts, redlock, redis_scripts)
        for script in vars(module).values()
        if isinstance(script, Script)
    }
    scripts = list(fixed.values())
    policies = [_policy(a) for a in ALGORITHMS]
    leased = [_policy(a) for a in ALGORITHMS if not isinstance(a.lease, NotLeased)]
    scripts += [decide_script([p]) for p in policies] + [decide_script(policies)]
    scripts += [lease_script(PolicySet([p])) for p in leased] + [lease_script(PolicySet(leased))]
    for built in (reserve_script, settle_script):
        scripts += [built([p]) for p in policies] + [built(policies)]
    return scripts


def _lua_scripts() -> set[str]:
    """The Lua files that run as scripts (named as ``Script`` names them): every file under
    ``lua/`` but the libraries and fragments, whose opening comment says they never run
    alone."""
    root = Path(headway.__file__).parent / "lua"
    names = set()
    for path in root.rglob("*.lua"):
        comment = itertools.takewhile(
            lambda line: line.startswith("--"), path.read_text().split("\n")
        )
        opening = " ".join(line.lstrip("-").strip() for line in comment)
        if "run alone" not in opening:
            names.add(path.relative_to(root).with_suffix("").as_posix())
    return names


def _expected_scripts() -> dict[str, int]:
    """How many scripts run each Lua file: one, but for those built per algorithm: one per
    algorithm (per leased one for a lease), and one for all of them together (a single
    policy's decision runs ``decide_one``, several ``decide``)."""
    algorithms = len(ALGORITHMS)
    leased = sum(not isinstance(a.lease, NotLeased) for a in ALGORITHMS)
    per_algorithm = {
        "ratelimit/decide_one": algorithms,
        "ratelimit/lease": leased + 1,
        "ratelimit/reserve": algorithms + 1,
        "ratelimit/settle": algorithms + 1,
    }
    return {name: per_algorithm.get(name, 1) for name in _lua_scripts()}


def test_every_script_loads_as_a_library(server: Server) -> None:
    client = redis.Redis(port=server.port)
    scripts = _every_script()
    assert collections.Counter(script.name for script in scripts) == _expected_scripts()
    for script in scripts:
        assert client.function_load(script.library, replace=True) == script.function.encode()
    client.close()


async def test_an_error_inside_a_function_is_raised_and_the_call_not_sent_again(
    server: Server,
) -> None:
    # ACL refuses the script's TIME after its SET ran: sent again, the SET would run twice.
    _user(server, "-time")
    client = aioredis.Redis(port=server.port, username="app")
    wires = Wires(client)
    counting = Script.from_source("counting", "redis.call('INCR', KEYS[1]) redis.call('TIME')")
    # Redis 7.0: "The user executing the script can't run this command ... script: ...";
    # 7.2: "ACL failure in script: ... no permissions ..." (``test_scripts.py`` has both).
    with pytest.raises(redis.ResponseError, match="@user_function"):
        await wires.call(counting, ["n"], [])
    assert wires.wire().functions
    assert await client.get("n") == b"1"
    assert "evalsha" not in _commands(server)
    await wires.aclose()
    await client.aclose()


async def test_out_of_memory_locks_and_slots_are_still_given_back(
    redis_servers: RedisServers,
) -> None:
    server = redis_servers.start("--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
    client = aioredis.Redis(port=server.port)
    lock = Lock(RedisLockBackend(client), "oom", ttl=5)
    concurrency = Concurrency(2, ttl=5.0)
    slots = ConcurrencyLimiter(concurrency, backend=RedisRateLimitBackend(client))
    limiter = RateLimiter(FixedWindow(10, NO_ROLLOVER), backend=RedisRateLimitBackend(client))
    try:
        # Every library loaded first: a load refused out of memory falls back to EVALSHA.
        await lock.release(await lock.extend(await lock.acquire()))
        await slots.release(await slots.acquire("w"))
        lease = await lock.acquire()
        slot = await slots.acquire("k")
        filler = b"x" * 10_000
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(10_000):
                await client.set(f"fill{i}", filler)
        # Far past the limit, not at its edge (where a freed buffer would let the next
        # write in): the server keeps what it holds and refuses every write that grows it.
        await client.config_set("maxmemory", "1mb")
        # Out of memory: a decision fails open (the policy's on_error), nothing raises...
        assert (await limiter.hit("k")).source is Source.FAILED_OPEN
        # ...and what frees memory still runs: a lock extended and released, a slot back.
        lease = await lock.extend(lease)
        await lock.release(lease)
        await slots.release(slot)
        assert not await client.exists(lock_keys("oom").owner)
        assert await client.zcard(slot_key("k", concurrency)) == 0
    finally:
        await client.aclose()
        redis_servers.stop(server)
