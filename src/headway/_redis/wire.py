"""The fast path under the Redis backends: script calls on a pipelined connection of our own.

redis-py's asyncio client spends about 100 µs of client CPU per command on a small
VM (pool checkout, packing, a timeout scope, its stream reader): on loopback that
is two to three times the round trip itself. Our hot commands are all calls of
a handful of scripts, so they go over one connection per client and event loop
that we drive ourselves: redis-py opens it (URL, TLS, AUTH, HELLO, SELECT stay its
business), then the ``PipelinedConnection`` of ``_redis.connection`` takes the
socket over (how it writes, matches replies, times calls out and hands replies
nobody waits for to an ``orphan``: see there).

A Cluster client gets a ``ClusterWire`` instead (``_redis.cluster_wire``: the same
interface, a pipelined connection per node, calls routed by slot). A client whose
connections we cannot take over, or ``enabled=False``, sends each call through
redis-py. ``SyncWire`` (``_redis.sync_wire``) is the same for sync clients.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis import asyncio as aioredis

from headway._clock import within
from headway._redis.connection import Orphan, PipelinedConnection, ScriptCall, orphaned, take_over
from headway._redis.resp import Arg, Packed, refused, tail, unpacked
from headway._redis.scripts import Script

if TYPE_CHECKING:
    from headway._redis.cluster_wire import ClusterWire

__all__ = ["Wire", "Wires", "forget", "reply_of", "through_redis_py"]


def forget(future: asyncio.Future[Any]) -> None:
    """Let a call run without waiting for it (its failure is not worth a warning)."""
    future.add_done_callback(_consume)


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class Wire:
    """Script calls on one client and event loop over one pipelined connection.

    ``requests`` and ``writes`` count the calls sent and the socket writes that
    carried them (library loads and NOSCRIPT resends included), for tests and benchmarks.
    """

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.supported = True
        self.functions = True
        self.requests = 0
        self.writes = 0
        self._connection: PipelinedConnection | None = None
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
        elements, packed = tail(keys, args)
        call = ScriptCall(
            self.loop.create_future(), script, elements, packed, orphan, timeout, always
        )
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
        """Run ``script`` and return its reply (see ``_redis.connection`` for ``orphan``,
        and ``submit`` for ``always``)."""
        if not self.ready:
            await self._connect()
            if not self.supported:
                return await through_redis_py(self.client, script, keys, args, orphan, always)
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
            connection = take_over(self, borrowed)
            if connection is None:
                self.supported = False
                await pool.release(borrowed)
                refused(borrowed)
                return
            self._borrowed, self._connection = borrowed, connection

    def redirected(self, call: ScriptCall, error: Exception) -> bool:
        """A single node has nowhere to send a call again: its error stands."""
        return False

    async def aclose(self) -> None:
        """Close the connection and give it back to the client's pool."""
        async with self._connecting:
            borrowed, self._borrowed, self._connection = self._borrowed, None, None
            if borrowed is not None:
                await borrowed.disconnect()
                await self.client.connection_pool.release(borrowed)


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


async def through_redis_py(
    client: Any,
    script: Script,
    keys: Sequence[str],
    args: Sequence[Arg] | Packed,
    orphan: Orphan | None,
    always: bool,
) -> Any:
    """Run ``script`` through redis-py (with ``always``, ``orphan`` gets the reply too)."""
    # Without ``always`` the orphan is the wire's business only (see ``Wires.call``).
    reply = await script.run(client, keys, unpacked(args))
    if always and orphan is not None:
        orphaned(orphan, reply)
    return reply


class Wires:
    """One wire per event loop for one client (or redis-py alone, when disabled).

    A ``Wire`` for a single node, a ``ClusterWire`` for a Cluster client: one interface.
    """

    def __init__(self, client: Any, enabled: bool = True) -> None:
        from headway._redis.cluster_wire import ClusterWire  # here: it imports this module

        self.client = client
        self.enabled = enabled
        self._kind: type[Wire | ClusterWire] = (
            ClusterWire if isinstance(client, aioredis.RedisCluster) else Wire
        )
        self._wires: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Wire | ClusterWire] = (
            weakref.WeakKeyDictionary()
        )
        self._recent: Wire | ClusterWire | None = None  # a weak-keyed lookup costs a weakref

    def wire(self) -> Wire | ClusterWire:
        """The running loop's wire."""
        loop = asyncio.get_running_loop()
        wire = self._recent
        if wire is not None and wire.loop is loop:
            return wire
        wire = self._wires.get(loop)
        if wire is None:
            wire = self._wires[loop] = self._kind(self.client, loop)
        self._recent = wire
        return wire

    def direct(self) -> bool:
        """True if calls go over our own connection (which never sends one twice)."""
        return self.enabled and self.wire().supported

    def ready_wire(self) -> Wire | ClusterWire | None:
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
            pending = through_redis_py(self.client, script, keys, args, orphan, always)
        return await (pending if timeout is None else within(timeout, pending))

    async def aclose(self) -> None:
        """Close the running loop's wire, if it has one."""
        wire = self._wires.pop(asyncio.get_running_loop(), None)
        if wire is self._recent:
            self._recent = None
        if wire is not None:
            await wire.aclose()
