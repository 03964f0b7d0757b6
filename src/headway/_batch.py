"""Coalescing: concurrent script calls on one client, sent as one pipelined round trip.

A call made while nothing is in flight goes out at once, alone (a lone
caller waits for nobody). A call made while others are in flight is queued:
the first one queued schedules a flush for the next turn of the event loop,
and every call queued by then goes out in one ``pipeline(transaction=False)``
of EVALSHAs. Each script still runs atomically on the server, in the order
queued, so decisions are the ones separate calls would get; only the number
of round trips (and the client's and server's work per call) goes down.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis import asyncio as aioredis
from redis import exceptions as redis_errors

from ._scripts import Arg, Script

__all__ = ["Batcher", "Coalescer"]


@dataclass(slots=True)
class _Call:
    script: Script
    keys: Sequence[str]
    args: Sequence[Arg]
    future: asyncio.Future[Any] = field(repr=False)


class Batcher:
    """Sends the script calls queued during one loop turn as one pipeline.

    One batcher serves one event loop; ``max_batch`` bounds a pipeline
    (a longer queue is split into several, sent side by side).
    """

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop, max_batch: int = 256) -> None:
        self.client = client
        self.loop = loop
        self.max_batch = max_batch
        self._queue: list[_Call] = []
        self._sending: set[asyncio.Task[None]] = set()
        self._alone = 0  # calls sent at once, still in flight
        self.calls = 0  # counted for tests and benchmarks: calls made ...
        self.round_trips = 0  # ... and the round trips that carried them (NOSCRIPT retries aside)

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """Send one call (or queue it) and wait for its reply (raises what the call raises)."""
        self.calls += 1
        if not (self._alone or self._queue or self._sending):
            self.round_trips += 1
            self._alone += 1
            try:
                return await script.run(self.client, keys, args)
            finally:
                self._alone -= 1
        future = self.loop.create_future()
        if not self._queue:
            self.loop.call_soon(self._flush)
        self._queue.append(_Call(script, keys, args, future))
        return await future

    def _flush(self) -> None:
        queue, self._queue = self._queue, []
        for start in range(0, len(queue), self.max_batch):
            self.round_trips += 1
            task = self.loop.create_task(self._send(queue[start : start + self.max_batch]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, calls: list[_Call]) -> None:
        try:
            if len(calls) == 1:
                call = calls[0]
                _settle(call, await call.script.run(self.client, call.keys, call.args))
                return
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
            replies = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # the round trip failed: so did every call in it
            for call in calls:
                if call.future.done():
                    continue
                if isinstance(exc, Exception):
                    call.future.set_exception(exc)
                else:
                    call.future.cancel()
            if not isinstance(exc, Exception):
                raise
            return
        missing = []
        for call, reply in zip(calls, replies, strict=True):
            if isinstance(reply, redis_errors.NoScriptError):
                missing.append(call)  # Redis restarted or SCRIPT FLUSH: EVAL loads it again
            else:
                _settle(call, reply)
        if missing:
            await asyncio.gather(*(self._one(call) for call in missing))

    async def _one(self, call: _Call) -> None:
        try:
            reply = await call.script.run(self.client, call.keys, call.args)
        except Exception as exc:
            if not call.future.done():
                call.future.set_exception(exc)
            return
        _settle(call, reply)


def _settle(call: _Call, reply: Any) -> None:
    if call.future.done():  # its caller gave up (cancelled, out of budget)
        return
    if isinstance(reply, Exception):
        call.future.set_exception(reply)
    else:
        call.future.set_result(reply)


class Coalescer:
    """Script calls on one client, coalesced per event loop (see ``Batcher``).

    Disabled, or on a Cluster client (a pipeline there would span nodes), every
    call is sent on its own.
    """

    def __init__(self, client: Any, enabled: bool = True) -> None:
        self.client = client
        self.enabled = enabled and not isinstance(client, aioredis.RedisCluster)
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Batcher] = (
            weakref.WeakKeyDictionary()
        )

    def batcher(self) -> Batcher:
        """The running loop's batcher."""
        loop = asyncio.get_running_loop()
        batcher = self._batchers.get(loop)
        if batcher is None:
            batcher = self._batchers[loop] = Batcher(self.client, loop)
        return batcher

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """Run ``script``, in a shared pipeline if others are in flight."""
        if not self.enabled:
            return await script.run(self.client, keys, args)
        return await self.batcher().run(script, keys, args)
