"""The fast path under the Redis backends: script calls on a pipelined connection of our own.

redis-py's asyncio client spends about 100 µs of client CPU per command on a small
VM (pool checkout, packing, a timeout scope, its stream reader): on loopback that
is two to three times the round trip itself. Our hot commands are all EVALSHAs of
a handful of scripts, so they go over one connection per client and event loop
that we drive ourselves: redis-py opens it (URL, TLS, AUTH, HELLO, SELECT stay its
business), then an ``asyncio.Protocol`` of ours takes the socket over.

- A call made while nothing is in flight is written at once. Calls made while
  replies are outstanding are written together on the next loop turn, so
  concurrent calls share writes and reads (what a pipeline gives, without one).
- Redis answers a connection's commands in order, so replies are matched to calls
  first in, first out; hiredis parses them.
- NOSCRIPT (a restart, ``SCRIPT FLUSH``) is answered by sending the same call as
  ``EVAL`` with the script's source, on the same call.
- A caller that stops waiting (cancelled, out of time) does not lose its reply:
  the call's ``orphan`` callback gets it, so a lock granted to a caller who gave
  up can be released again. A call, once written, is never taken back.
- A call may carry a deadline; a connection's deadlines share one loop timer. A
  reply overdue by the client's ``socket_timeout`` drops the connection.
- A lost connection fails the calls in flight with redis-py's ``ConnectionError``
  (their outcome is unknown); the next call opens a new one.

A Cluster client, a client whose connections we cannot take over, or
``enabled=False`` sends each call through redis-py instead. ``SyncWire`` is the
same for sync clients: a socket per thread in a call.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import hiredis
from redis import asyncio as aioredis
from redis import cluster as redis_cluster
from redis import exceptions as redis_errors

from headway._clock import within
from headway._redis.scripts import Arg, Script

__all__ = ["Packed", "SyncWire", "Wire", "Wires", "forget", "pack", "pack_keys", "reply_of"]

log = logging.getLogger("headway")

#: Receives the reply of a call whose caller stopped waiting.
Orphan = Callable[[Any], object]

try:  # redis-py's own mapping of error replies to exception classes (NOSCRIPT, READONLY, ...)
    from redis._parsers.base import BaseParser

    _error: Callable[[str], Exception] = BaseParser.parse_error
except ImportError:  # pragma: no cover - a redis-py without it: one class for all
    _error = redis_errors.ResponseError


def _bulk(value: Arg) -> bytes:
    # Encoded as redis-py's encoder does: str as UTF-8, numbers by repr, bytes as they are.
    data: bytes
    if isinstance(value, str):
        data = value.encode()
    elif type(value) is int:  # not bool, a subclass of int that redis-py refuses
        data = b"%d" % value
    elif isinstance(value, bool):
        raise redis_errors.DataError(
            "Invalid input of type: 'bool'. Convert to a bytes, string, int or float first."
        )
    elif isinstance(value, bytes):
        data = value
    else:
        data = repr(value).encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


class Packed(NamedTuple):
    """Arguments packed once by ``pack`` and reused for many calls."""

    values: tuple[Arg, ...]
    data: bytes


def pack(args: Sequence[Arg]) -> Packed:
    """Pack script arguments that many calls share (they cost nothing per call then)."""
    return Packed(tuple(args), b"".join(map(_bulk, args)))


def _values(args: Sequence[Arg] | Packed) -> Sequence[Arg]:
    return args.values if isinstance(args, Packed) else args


@functools.lru_cache(maxsize=4096)
def _packed_keys(keys: tuple[str, ...]) -> bytes:
    return b"".join([_bulk(len(keys)), *map(_bulk, keys)])


def pack_keys(keys: Sequence[str]) -> Packed:
    """Pack script keys that many calls share (``Wire.submit`` takes them as they are)."""
    values = tuple(keys)
    return Packed(values, _packed_keys.__wrapped__(values))


def _tail(keys: Sequence[str] | Packed, args: Sequence[Arg] | Packed) -> tuple[int, bytes]:
    """The part of an EVAL/EVALSHA after the script: (element count, packed bytes).

    Keys given as a tuple are packed once and remembered (a lock's keys are the
    same on every call); a list is packed afresh. Either may come packed.
    """
    if isinstance(keys, Packed):
        count, packed = len(keys.values), keys.data
    elif isinstance(keys, tuple):
        count, packed = len(keys), _packed_keys(keys)
    else:
        count, packed = len(keys), _packed_keys.__wrapped__(tuple(keys))
    if isinstance(args, Packed):
        return 1 + count + len(args.values), packed + args.data
    return 1 + count + len(args), b"".join([packed, *map(_bulk, args)])


class _Call:
    __slots__ = (
        "always",
        "count",
        "deadline",
        "future",
        "orphan",
        "reloaded",
        "script",
        "sent",
        "tail",
        "timeout",
    )

    def __init__(
        self,
        future: asyncio.Future[Any],
        script: Script,
        count: int,
        tail: bytes,
        orphan: Orphan | None,
        timeout: float | None,
        always: bool = False,
    ) -> None:
        self.future = future
        self.script = script
        self.count = count
        self.tail = tail
        self.orphan = orphan
        self.timeout = timeout
        self.always = always
        self.reloaded = False
        self.sent = self.deadline = 0.0


class _Connection(asyncio.Protocol):
    """One socket taken over from redis-py: writes calls, matches replies to them in order."""

    def __init__(
        self,
        wire: Wire,
        transport: asyncio.Transport,
        inner: asyncio.BaseProtocol,
        stall: float | None,
    ) -> None:
        self.wire = wire
        self.loop = wire.loop
        # A reply overdue by this much (the client's socket_timeout) means the socket
        # is stuck: it is dropped, as redis-py drops one, and the next call reconnects.
        self.stall = stall
        self.timer: asyncio.TimerHandle | None = None
        self.transport = transport
        # redis-py's stream protocol, told when the socket closes so its disconnect() returns.
        self.inner = inner
        self.reader = hiredis.Reader(replyError=_error)
        self.pending: deque[_Call] = deque()
        self.out: list[bytes] = []
        self.lost = False

    def send(self, call: _Call) -> None:
        head = call.script.eval_head if call.reloaded else call.script.evalsha_head
        data = b"*%d\r\n%b%b" % (call.count + 2, head, call.tail)
        self.wire.requests += 1
        if self.pending:  # replies outstanding: share the write of the next loop turn
            if not self.out:
                self.loop.call_soon(self._flush)
            self.out.append(data)
        else:
            self.wire.writes += 1
            self.transport.write(data)
        self.pending.append(call)
        if call.timeout is not None or self.stall is not None:
            call.sent = self.loop.time()
            if call.timeout is not None:
                call.deadline = call.sent + call.timeout
                if self.timer is not None and call.deadline < self.timer.when():
                    self.timer.cancel()  # due before the armed timer: re-arm (rare)
                    self.timer = None
            if self.timer is None:
                self._arm()

    def _arm(self) -> None:
        # One timer for every call on the connection (a timer handle per call costs
        # more than the call's own bookkeeping): at the nearest deadline of a call
        # still waited for, or when the oldest reply would be overdue.
        nearest = min(
            (c.deadline for c in self.pending if c.timeout is not None and not c.future.done()),
            default=None,
        )
        if self.stall is not None and self.pending:
            overdue = self.pending[0].sent + self.stall
            nearest = overdue if nearest is None else min(nearest, overdue)
        if nearest is not None:
            self.timer = self.loop.call_at(nearest, self._check)

    def _check(self) -> None:
        self.timer = None
        if self.lost:
            return
        now = self.loop.time()
        for call in self.pending:
            if call.timeout is not None and call.deadline <= now and not call.future.done():
                # Its reply, if it comes, goes to the orphan.
                call.future.set_exception(
                    redis_errors.TimeoutError(f"Redis did not answer within {call.timeout:g} s")
                )
        if self.stall is not None and self.pending and now - self.pending[0].sent >= self.stall:
            log.warning("no reply from Redis in %g s: dropping the connection", self.stall)
            self.transport.abort()
            return
        self._arm()

    def _flush(self) -> None:
        out, self.out = self.out, []
        if out and not self.lost:
            self.wire.writes += 1
            self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            try:
                reply = self.reader.gets()
            except hiredis.ProtocolError:
                log.exception("closing a Redis connection that sent a malformed reply")
                self.transport.abort()
                return
            if reply is False:
                return
            self._settle(self.pending.popleft(), reply)

    def _settle(self, call: _Call, reply: Any) -> None:
        if isinstance(reply, redis_errors.NoScriptError) and not call.reloaded:
            call.reloaded = True  # EVAL runs the call and caches the script again
            self.send(call)
            return
        future = call.future
        if isinstance(reply, Exception):
            if not future.done():
                future.set_exception(reply)
            return
        if call.orphan is not None and (call.always or future.done()):
            orphaned(call.orphan, reply)
        if not future.done():
            future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.timer is not None:
            self.timer.cancel()
        error = redis_errors.ConnectionError(
            f"Connection to Redis lost: {exc}" if exc else "Connection to Redis closed."
        )
        pending, self.pending, self.out = self.pending, deque(), []
        for call in pending:
            if not call.future.done():
                call.future.set_exception(error)
        self.inner.connection_lost(exc)

    def eof_received(self) -> bool:
        return False  # close our end too: connection_lost follows


def orphaned(orphan: Orphan, reply: Any) -> None:
    """Hand ``reply`` to ``orphan``; its errors are logged, never raised into the reader."""
    try:
        orphan(reply)
    except Exception:
        log.exception("handling the reply of an abandoned Redis call failed")


def forget(future: asyncio.Future[Any]) -> None:
    """Let a call run without waiting for it (its failure is not worth a warning)."""
    future.add_done_callback(_consume)


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class _Unsupported(Exception):
    """The client's connections cannot be taken over: use redis-py for every call."""


class Wire:
    """Script calls on one client and event loop over one pipelined connection.

    ``requests`` and ``writes`` count the calls sent and the socket writes that
    carried them (NOSCRIPT reloads included), for tests and benchmarks.
    """

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.supported = True
        self.requests = 0
        self.writes = 0
        self._connection: _Connection | None = None
        self._borrowed: Any = None  # the redis-py Connection whose socket we drive
        self._connecting = asyncio.Lock()

    @property
    def ready(self) -> bool:
        """True if a call would be written at once (connected, no set-up to await)."""
        return self._connection is not None and not self._connection.lost

    def submit(
        self,
        script: Script,
        keys: Sequence[str] | Packed,
        args: Sequence[Arg] | Packed,
        orphan: Orphan | None = None,
        timeout: float | None = None,
        always: bool = False,
    ) -> asyncio.Future[Any]:
        """Write one call now and return the future of its reply (requires ``ready``).

        After ``timeout`` seconds without a reply the future fails with redis-py's
        ``TimeoutError`` (the reply, if it comes, goes to ``orphan``). With ``always``,
        ``orphan`` gets the reply even when somebody waits for it, as it arrives: one
        loop turn before the waiter resumes.
        """
        connection = self._connection
        assert connection is not None
        assert not connection.lost
        count, tail = _tail(keys, args)
        call = _Call(self.loop.create_future(), script, count, tail, orphan, timeout, always)
        connection.send(call)
        return call.future

    async def call(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg] | Packed,
        orphan: Orphan | None = None,
        always: bool = False,
    ) -> Any:
        """Run ``script`` and return its reply (see the module for ``orphan``, and
        ``submit`` for ``always``)."""
        if not self.ready:
            await self._connect()
            if not self.supported:
                reply = await script.run(self.client, keys, _values(args))
                if always and orphan is not None:
                    orphaned(orphan, reply)
                return reply
        future = self.submit(script, keys, args, orphan, None, always)
        return await reply_of(future, None if always else orphan)

    async def _connect(self) -> None:
        async with self._connecting:
            if self.ready or not self.supported:
                return
            pool = self.client.connection_pool
            if self._borrowed is not None:  # the previous socket is gone: hand it back
                borrowed, self._borrowed = self._borrowed, None
                await borrowed.disconnect(nowait=True)
                await pool.release(borrowed)
            borrowed = await pool.get_connection()
            try:
                transport, inner = _take_over(borrowed)
            except _Unsupported:
                self.supported = False
                await pool.release(borrowed)
                log.warning("cannot drive %r directly: every call goes through redis-py", borrowed)
                return
            stall = getattr(borrowed, "socket_timeout", None)
            connection = _Connection(self, transport, inner, stall)
            transport.set_protocol(connection)
            self._borrowed, self._connection = borrowed, connection

    async def aclose(self) -> None:
        """Close the connection and give it back to the client's pool."""
        async with self._connecting:
            borrowed, self._borrowed, self._connection = self._borrowed, None, None
            if borrowed is not None:
                await borrowed.disconnect()
                await self.client.connection_pool.release(borrowed)


def _take_over(borrowed: Any) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
    writer = getattr(borrowed, "_writer", None)
    reader = getattr(borrowed, "_reader", None)
    transport = getattr(writer, "transport", None)
    # Anything already read but not consumed would be a reply we could not place.
    buffered = len(getattr(reader, "_buffer", b""))
    if transport is None or not hasattr(transport, "set_protocol") or buffered:
        raise _Unsupported
    return transport, transport.get_protocol()


async def reply_of(future: asyncio.Future[Any], orphan: Orphan | None) -> Any:
    """Await a call's reply; if cancelled just after it arrived, ``orphan`` still gets it."""
    try:
        return await future
    except asyncio.CancelledError:
        # Cancelled while waiting, the future is cancelled and the reader calls the
        # orphan. Cancelled with the reply already set, only we can.
        if (
            orphan is not None
            and future.done()
            and not future.cancelled()
            and future.exception() is None
        ):
            orphaned(orphan, future.result())
        raise


class Wires:
    """One ``Wire`` per event loop for one client (or redis-py alone, when disabled)."""

    def __init__(self, client: Any, enabled: bool = True) -> None:
        self.client = client
        self.enabled = enabled and not isinstance(client, aioredis.RedisCluster)
        self._wires: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Wire] = (
            weakref.WeakKeyDictionary()
        )
        self._recent: Wire | None = None  # a weak-keyed lookup costs a weakref per call

    def wire(self) -> Wire:
        """The running loop's wire."""
        loop = asyncio.get_running_loop()
        wire = self._recent
        if wire is not None and wire.loop is loop:
            return wire
        wire = self._wires.get(loop)
        if wire is None:
            wire = self._wires[loop] = Wire(self.client, loop)
        self._recent = wire
        return wire

    def direct(self) -> bool:
        """True if calls go over our own connection (which never sends one twice)."""
        return self.enabled and self.wire().supported

    def ready(self) -> Wire | None:
        """The running loop's wire if calls on it are written at once, else None."""
        if not self.enabled:
            return None
        wire = self.wire()
        return wire if wire.ready else None

    async def call(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg] | Packed,
        orphan: Orphan | None = None,
        timeout: float | None = None,
        always: bool = False,
    ) -> Any:
        """Run ``script`` on the running loop's wire, or through redis-py when disabled.

        ``orphan`` is honoured on the wire only: callers that need it through
        redis-py keep their own cancellation shield. With ``always`` it gets every
        reply (see ``Wire.submit``), through redis-py too (after the await).
        ``timeout`` bounds the call (connecting included): ``TimeoutError``,
        redis-py's or the builtin.
        """
        if self.enabled:
            wire = self.wire()
            if wire.ready:  # the hot path: no timer of its own, one coroutine frame less
                future = wire.submit(script, keys, args, orphan, timeout, always)
                return await reply_of(future, None if always else orphan)
            pending = wire.call(script, keys, args, orphan, always)
        else:
            pending = script.run(self.client, keys, _values(args))
        reply = await (pending if timeout is None else within(timeout, pending))
        if always and orphan is not None and not self.enabled:
            orphaned(orphan, reply)
        return reply

    async def aclose(self) -> None:
        """Close the running loop's wire, if it has one."""
        wire = self._wires.pop(asyncio.get_running_loop(), None)
        if wire is self._recent:
            self._recent = None
        if wire is not None:
            await wire.aclose()


class _SyncConnection:
    """One socket taken over from a sync redis-py connection: a call, then its reply."""

    def __init__(self, borrowed: Any) -> None:
        self.borrowed = borrowed  # kept, so its __del__ closes the socket with it
        self.sock = borrowed._sock
        self.reader = hiredis.Reader(replyError=_error)

    def call(self, script: Script, keys: Sequence[str], args: Sequence[Arg] | Packed) -> Any:
        count, tail = _tail(keys, args)
        reply = self._round_trip(b"*%d\r\n%b%b" % (count + 2, script.evalsha_head, tail))
        if isinstance(reply, redis_errors.NoScriptError):  # EVAL runs it and caches it again
            reply = self._round_trip(b"*%d\r\n%b%b" % (count + 2, script.eval_head, tail))
        return reply

    def _round_trip(self, data: bytes) -> Any:
        self.sock.sendall(data)
        while (reply := self.reader.gets()) is False:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise redis_errors.ConnectionError("Connection closed by Redis.")
            self.reader.feed(chunk)
        return reply

    def close(self) -> None:
        self.borrowed.disconnect()


class SyncWire:
    """The sync counterpart of ``Wire``: script calls on sockets headway drives itself.

    Each call takes an idle connection (or opens one with redis-py, from the client's
    settings), writes the call, reads its reply and puts the connection back, so
    threads never share one mid-call. A connection that fails mid-call is closed: what
    became of its call is unknown. ``enabled=False`` or a Cluster client sends every
    call through redis-py.
    """

    def __init__(self, client: Any, enabled: bool = True) -> None:
        self.client = client
        self.enabled = enabled and not isinstance(client, redis_cluster.RedisCluster)
        self.requests = 0
        self._idle: list[_SyncConnection] = []
        self._pid = os.getpid()

    def call(self, script: Script, keys: Sequence[str], args: Sequence[Arg] | Packed) -> Any:
        """Run ``script`` and return its reply (an error reply is raised)."""
        if not self.enabled:
            return script.run_sync(self.client, keys, _values(args))
        if os.getpid() != self._pid:  # forked: the parent's sockets are not ours to use
            self._idle, self._pid = [], os.getpid()
        connection: _SyncConnection | None
        try:
            connection = self._idle.pop()  # atomic: threads never get the same one
        except IndexError:
            connection = self._open()
        if connection is None:
            return script.run_sync(self.client, keys, _values(args))
        self.requests += 1
        try:
            reply = connection.call(script, keys, args)
        except BaseException:
            connection.close()
            raise
        self._idle.append(connection)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _open(self) -> _SyncConnection | None:
        borrowed = self.client.connection_pool.make_connection()
        borrowed.connect()
        if getattr(borrowed, "_sock", None) is None:
            borrowed.disconnect()
            self.enabled = False
            log.warning("cannot drive %r directly: every call goes through redis-py", borrowed)
            return None
        return _SyncConnection(borrowed)

    def close(self) -> None:
        """Close the idle connections (one still in a call closes when it is collected)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
