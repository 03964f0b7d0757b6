"""The locks compared by ``lock_bench.py``, behind one tiny acquire/release shape.

Each subject makes one lock object per worker (the peers keep their token in
the lock object) and exposes ``acquire()`` / ``release()``; headway's leases
make a shared ``Lock`` safe, so its workers share one. Every lock gets a 10 s
TTL and waits without a deadline short enough to matter.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import redis_lock
from pottery import Redlock
from redis import asyncio as aioredis
from redis.exceptions import NoScriptError

import headway
from headway._redis.scripts import Script
from headway._redis.sync_wire import SyncWire
from headway._redis.wire import Wires

TTL = 10
WAIT = 60.0


class Writes:
    """Requests written to Redis by the counting connections (one per round trip)."""

    count = 0


class CountingConnection(redis.Connection):
    def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        Writes.count += 1
        super().send_packed_command(*args, **kwargs)  # type: ignore[no-untyped-call]


class CountingAsyncConnection(aioredis.Connection):
    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        Writes.count += 1
        await super().send_packed_command(*args, **kwargs)


class SyncWorker(Protocol):
    def acquire(self) -> None: ...

    def release(self) -> None: ...

    def close(self) -> None:
        """Free what the workers of one subject share (once, after the run)."""


class AsyncWorker(Protocol):
    async def acquire(self) -> None: ...

    async def release(self) -> None: ...

    async def aclose(self) -> None:
        """Free what the workers of one subject share (once, after the run)."""


@dataclass
class Subject:
    """One library under test; ``make(client, key)`` returns a per-worker factory."""

    name: str
    is_async: bool
    make: Callable[[Any, str], Callable[[], Any]]
    note: str = ""
    #: False for the floor rows, which exclude nothing.
    contend: bool = True
    #: False for a row only measured under contention (the fair hand-off floor).
    calm: bool = True


class _HeadwaySync:
    def __init__(self, lock: headway.SyncLock) -> None:
        self.lock = lock
        self.lease: headway.Lease | None = None

    def wire_requests(self) -> int:
        """Requests written on headway's own sockets (not seen by ``Writes``)."""
        backend = self.lock.backend
        assert isinstance(backend, headway.SyncRedisLockBackend)
        return backend._wire.requests

    def acquire(self) -> None:
        self.lease = self.lock.acquire()

    def release(self) -> None:
        assert self.lease is not None
        self.lock.release(self.lease)

    def close(self) -> None:
        backend = self.lock.backend
        assert isinstance(backend, headway.SyncRedisLockBackend)
        backend.close()


class _HeadwayAsync:
    def __init__(self, lock: headway.Lock) -> None:
        self.lock = lock
        self.lease: headway.Lease | None = None

    def wire_requests(self) -> int:
        """Requests written on headway's own connection (not seen by ``Writes``)."""
        backend = self.lock.backend
        assert isinstance(backend, headway.RedisLockBackend)
        return backend._wires.wire().requests

    async def aclose(self) -> None:
        backend = self.lock.backend
        assert isinstance(backend, headway.RedisLockBackend)
        await backend.aclose()

    async def acquire(self) -> None:
        self.lease = await self.lock.acquire()

    async def release(self) -> None:
        assert self.lease is not None
        await self.lock.release(self.lease)


class _HeadwayHold(_HeadwayAsync):
    """``async with lock.hold()``: the same cycle plus the renewal watchdog."""

    held: Any = None

    async def acquire(self) -> None:
        self.held = self.lock.hold()
        await self.held.__aenter__()

    async def release(self) -> None:
        await self.held.__aexit__(None, None, None)


class _Plain:
    """A peer lock whose ``acquire()`` blocks until granted and ``release()`` frees it."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def acquire(self) -> None:
        assert self.lock.acquire()

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        pass


class _PlainAsync:
    def __init__(self, lock: Any) -> None:
        self.lock = lock

    async def acquire(self) -> None:
        assert await self.lock.acquire()

    async def release(self) -> None:
        await self.lock.release()

    async def aclose(self) -> None:
        pass


_NOOP = "return 1"


class _Floor:
    """Two EVALSHA of a script that returns 1: what two round trips cost through the client."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sha = client.script_load(_NOOP)

    def acquire(self) -> None:
        self.client.evalsha(self.sha, 0)

    release = acquire

    def close(self) -> None:
        pass


class _FairLine:
    """The least a fair lock's contended grant costs: a FIFO line of threads in which
    every grant is one round trip (a ``return 1`` script on headway's own sockets, where
    a real lock records its holder) and one hand-off to the next thread. Excludes only
    the threads of one process; no lease, no fence."""

    def __init__(self, client: Any) -> None:
        self.wire = SyncWire(client)
        self.mutex = threading.Lock()
        self.held = False
        self.line: deque[threading.Lock] = deque()

    def worker(self) -> _FairWorker:
        return _FairWorker(self)


class _FairWorker:
    def __init__(self, line: _FairLine) -> None:
        self.line = line
        self.turn = threading.Lock()
        self.turn.acquire()

    def acquire(self) -> None:
        line = self.line
        with line.mutex:
            if not line.held:
                line.held = True
                return
            line.line.append(self.turn)
        self.turn.acquire()  # released by the holder that hands the lock to us

    def release(self) -> None:
        line = self.line
        line.wire.call(_NOOP_SCRIPT, ["k"], [])
        with line.mutex:
            if line.line:
                line.line.popleft().release()
            else:
                line.held = False

    def close(self) -> None:
        self.line.wire.close()


def _fair_floor(client: Any, key: str) -> Callable[[], _FairWorker]:
    return _FairLine(client).worker


class _AsyncFloor:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.sha = hashlib.sha1(_NOOP.encode(), usedforsecurity=False).hexdigest()

    async def acquire(self) -> None:
        try:
            await self.client.evalsha(self.sha, 0)
        except NoScriptError:
            await self.client.script_load(_NOOP)

    release = acquire

    async def aclose(self) -> None:
        pass


class _WireFloor:
    """The same two round trips on headway's own pipelined connection."""

    def __init__(self, client: Any) -> None:
        self.wires = Wires(client)

    def wire_requests(self) -> int:
        return self.wires.wire().requests

    async def acquire(self) -> None:
        await self.wires.call(_NOOP_SCRIPT, ["k"], [])

    release = acquire

    async def aclose(self) -> None:
        await self.wires.aclose()


_NOOP_SCRIPT = Script.from_source("noop", _NOOP)


def _headway_async(client: Any, key: str) -> Callable[[], _HeadwayAsync]:
    lock = headway.Lock(headway.RedisLockBackend(client), key, ttl=TTL, timeout=WAIT)
    return lambda: _HeadwayAsync(lock)


def _headway_hold(client: Any, key: str) -> Callable[[], _HeadwayHold]:
    lock = headway.Lock(headway.RedisLockBackend(client), key, ttl=TTL, timeout=WAIT)
    return lambda: _HeadwayHold(lock)


def _headway_sync(client: Any, key: str) -> Callable[[], _HeadwaySync]:
    lock = headway.SyncLock(headway.SyncRedisLockBackend(client), key, ttl=TTL, timeout=WAIT)
    return lambda: _HeadwaySync(lock)


def _redis_py_async(client: Any, key: str) -> Callable[[], _PlainAsync]:
    return lambda: _PlainAsync(client.lock(key, timeout=TTL))


def _redis_py_sync(client: Any, key: str) -> Callable[[], _Plain]:
    return lambda: _Plain(client.lock(key, timeout=TTL))


def _python_redis_lock(client: Any, key: str) -> Callable[[], _Plain]:
    return lambda: _Plain(redis_lock.Lock(client, key, expire=TTL))


def _pottery(client: Any, key: str) -> Callable[[], _Plain]:
    return lambda: _Plain(Redlock(key=key, masters={client}, auto_release_time=TTL))


SUBJECTS = [
    Subject(
        "floor async", True, lambda c, k: lambda: _AsyncFloor(c), "2 x EVALSHA 'return 1'", False
    ),
    Subject(
        "floor async, headway's connection",
        True,
        lambda c, k: lambda: _WireFloor(c),
        "2 x EVALSHA 'return 1'",
        False,
    ),
    Subject("headway async", True, _headway_async),
    Subject("headway async hold()", True, _headway_hold, "acquire + renewal watchdog"),
    Subject("redis-py asyncio Lock", True, _redis_py_async, "polls every 0.1 s"),
    Subject("floor sync", False, lambda c, k: lambda: _Floor(c), "2 x EVALSHA 'return 1'", False),
    Subject(
        "floor sync, fair hand-off",
        False,
        _fair_floor,
        "1 EVALSHA 'return 1' + a FIFO hand-off between threads per grant",
        calm=False,
    ),
    Subject("headway sync", False, _headway_sync),
    Subject("redis-py Lock", False, _redis_py_sync, "polls every 0.1 s"),
    Subject("python-redis-lock", False, _python_redis_lock, "BLPOP signal list"),
    Subject("pottery Redlock", False, _pottery, "1 master; retries after 0-0.2 s"),
]

#: Which headway row each row is compared with.
BASELINE = {True: "headway async", False: "headway sync"}
