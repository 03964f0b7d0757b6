"""The pipelined connection: one socket taken over from redis-py, driven by an ``asyncio.Protocol``.

- A call made while nothing is in flight is written at once. Calls made while
  replies are outstanding are written together on the next loop turn, so
  concurrent calls share writes and reads (what a pipeline gives, without one).
- Redis answers a connection's commands in order, so replies are matched to calls
  first in, first out; hiredis parses them.
- A call is an ``FCALL`` of the script's function; "Function not found" (a new
  server, ``FUNCTION FLUSH``) is answered by loading the library and sending the same
  call again in one write (the calls in flight with it go after that one load), and a
  server without functions by ``EVALSHA`` (then ``EVAL`` after NOSCRIPT), on the same
  call (``_redis.scripts``).
- A caller that stops waiting (cancelled, out of time) does not lose its reply:
  the call's ``orphan`` callback gets it, so a lock granted to a caller who gave
  up can be released again. A call, once written, is never taken back.
- A call may carry a deadline; a connection's deadlines share one loop timer. A
  reply overdue by the client's ``socket_timeout`` drops the connection.
- A lost connection fails the calls in flight with redis-py's ``ConnectionError``
  (their outcome is unknown); the next call opens a new one.
- A MOVED, ASK or TRYAGAIN reply (Redis Cluster: the slot lives elsewhere, or is
  migrating) means the call did not run: the owner's ``redirected`` may send it again,
  on this connection or another, on the same future (``_redis.cluster_wire``); a call
  sent after ASK is preceded by ``ASKING`` on the same write.
- A READONLY reply means the server was demoted to a replica (a Sentinel failover):
  the call fails with ``ConnectionError`` and the connection is dropped, as redis-py's
  Sentinel-managed connection does, so the next call asks the pool (the Sentinels)
  for the primary again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import hiredis
from redis import exceptions as redis_errors

from headway._redis.resp import REQUEST, reply_error
from headway._redis.scripts import (
    EVALSHA,
    FCALL,
    LOAD,
    Script,
    functions_refused,
    load_failed,
    resend_stage,
)

__all__ = ["Orphan", "Owner", "PipelinedConnection", "ScriptCall", "orphaned", "take_over"]

log = logging.getLogger("headway")

#: Receives the reply of a call whose caller stopped waiting.
Orphan = Callable[[Any], object]

#: Error replies that say where a Cluster call should have gone (it did not run).
REDIRECTS = (redis_errors.AskError, redis_errors.TryAgainError)  # MovedError is an AskError
_ASKING = b"*1\r\n$6\r\nASKING\r\n"
# The stage of a marker taking a FUNCTION LOAD's reply (a call's stages are >= 0).
_LOAD_REPLY = -2


class Owner(Protocol):
    """What a connection needs from the wire that owns it (``Wire``, ``ClusterWire``)."""

    loop: asyncio.AbstractEventLoop
    requests: int
    writes: int
    #: False once its server answered that it runs no functions: calls send EVALSHA.
    functions: bool

    def redirected(self, call: ScriptCall, error: Exception) -> bool:
        """Take over ``call``, answered ``error`` (one of ``REDIRECTS``); False: fail it."""


class ScriptCall:
    """One script call: its reply's future, what to write, and its deadline."""

    __slots__ = (
        "always",
        "asking",
        "deadline",
        "elements",
        "future",
        "orphan",
        "redirects",
        "script",
        "sent",
        "slot",
        "stage",
        "tail",
        "timeout",
    )

    def __init__(
        self,
        future: asyncio.Future[Any],
        script: Script,
        elements: int,
        tail: bytes,
        orphan: Orphan | None,
        timeout: float | None,
        always: bool = False,
    ) -> None:
        self.future = future
        self.script = script
        self.elements = elements
        self.tail = tail
        self.orphan = orphan
        self.timeout = timeout
        self.always = always
        self.stage = -1  # how it is sent (``_redis.scripts``): chosen when first sent
        self.sent = self.deadline = 0.0
        # Cluster only: the key's slot, redirections followed, and whether the node
        # it goes to imports the slot (ASK: ``ASKING`` precedes it).
        self.slot = -1
        self.redirects = 0
        self.asking = False


class PipelinedConnection(asyncio.Protocol):
    """One socket taken over from redis-py: writes calls, matches replies to them in order."""

    def __init__(
        self,
        wire: Owner,
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
        self.reader = hiredis.Reader(replyError=reply_error)
        self.pending: deque[ScriptCall] = deque()
        self.out: list[bytes] = []
        self.lost = False
        # Scripts whose library load is written and not answered yet: a call that found
        # no function goes after it rather than loading the library again.
        self.loading: set[Script] = set()

    def send(self, call: ScriptCall) -> None:
        if call.stage < 0:
            call.stage = FCALL if self.wire.functions else EVALSHA
        data = REQUEST % (call.elements, call.script.head(call.stage), call.tail)
        # What goes first in the same write has its reply taken by a marker: ASKING
        # right before the call it is for, the library's load before both.
        if call.asking:
            data = _ASKING + data
        if call.stage == LOAD and call.script not in self.loading:
            self.loading.add(call.script)
            data = call.script.load_request + data
            self.pending.append(_marker(self.loop, call.script, _LOAD_REPLY))
        if call.asking:
            self.pending.append(_marker(self.loop, _NEVER_SENT))
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
            if call.timeout is not None and not call.deadline:  # a resent call keeps its own
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

    def _settle(self, call: ScriptCall, reply: Any) -> None:
        if call.stage == _LOAD_REPLY:
            self.loading.discard(call.script)
            if load_failed(reply):
                self.wire.functions = False
            return
        if isinstance(reply, Exception) and call.stage >= 0:
            stage = resend_stage(call.stage, reply)
            if stage is not None:  # the call did not run: send it the next way
                if functions_refused(reply):
                    self.wire.functions = False
                call.stage = stage
                self.send(call)
                return
        if isinstance(reply, REDIRECTS) and self.wire.redirected(call, reply):
            return
        future = call.future
        if isinstance(reply, redis_errors.ReadOnlyError):
            self._demoted(reply)
            reply = redis_errors.ConnectionError(f"Redis was demoted to a replica: {reply}")
        if isinstance(reply, Exception):
            if not future.done():
                future.set_exception(reply)
            return
        if call.orphan is not None and (call.always or future.done()):
            orphaned(call.orphan, reply)
        if not future.done():
            future.set_result(reply)

    def _demoted(self, reply: Exception) -> None:
        if not self.lost:
            log.warning("Redis answered READONLY (%s): dropping the connection", reply)
            self.transport.abort()  # connection_lost fails the calls written after this one

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


def _marker(loop: asyncio.AbstractEventLoop, script: Script, stage: int = -1) -> ScriptCall:
    # Stands for the reply to ASKING, or to a FUNCTION LOAD of ``script`` (``_LOAD_REPLY``),
    # in the FIFO: settled already, so its reply is dropped (a refused load is logged).
    future = loop.create_future()
    future.set_result(None)
    marker = ScriptCall(future, script, 0, b"", None, None)
    marker.sent = loop.time()
    marker.stage = stage
    return marker


# The ASKING marker's script: a ScriptCall needs one, and a marker is never written.
_NEVER_SENT = Script.from_source("asking-marker", "return 0")


def orphaned(orphan: Orphan, reply: Any) -> None:
    """Hand ``reply`` to ``orphan``; its errors are logged, never raised into the reader."""
    try:
        orphan(reply)
    except Exception:
        log.exception("handling the reply of an abandoned Redis call failed")


def take_over(wire: Owner, borrowed: Any) -> PipelinedConnection | None:
    """Drive ``borrowed``'s socket (a redis-py connection) ourselves; None if we cannot."""
    writer = getattr(borrowed, "_writer", None)
    reader = getattr(borrowed, "_reader", None)
    transport = getattr(writer, "transport", None)
    # Anything already read but not consumed would be a reply we could not place.
    buffered = len(getattr(reader, "_buffer", b""))
    if transport is None or not hasattr(transport, "set_protocol") or buffered:
        return None
    stall = getattr(borrowed, "socket_timeout", None)
    connection = PipelinedConnection(wire, transport, transport.get_protocol(), stall)
    transport.set_protocol(connection)
    return connection
