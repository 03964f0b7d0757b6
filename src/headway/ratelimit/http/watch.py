"""``ClientWatch``: notice that a waiting request's client left, without taking its body.

While a request waits for admission (``max_wait``) nothing reads its ``receive``:
the app has not started. The watch reads it, one call at a time, keeps every
message it reads, and completes its future at ``http.disconnect`` (or
``websocket.disconnect``), which sends the request out of its line
(``ClientGone``). When the wait ends, the read in progress is cancelled, which
loses nothing (servers make ``receive`` cancel-safe: Starlette's
``StreamingResponse`` cancels it too), and the app's ``receive`` hands over the
kept messages, in order, before asking the server again. The watch reads at most
``BODY_LIMIT`` bytes of body ahead; past that it stops reading, so a large upload
is never held in memory, and such a request leaves at its deadline only.

The watch starts only when a request has to wait: an admitted one never reads.
"""

from __future__ import annotations

import asyncio
import collections

from starlette.requests import HTTPConnection, Request
from starlette.websockets import WebSocket

from headway._http import Message, Receive
from headway.ratelimit.http.guard import Guard, Ruling
from headway.ratelimit.waiting import ClientGone

__all__ = ["BODY_LIMIT", "ClientWatch", "decide_watching"]

#: Bytes of request body the watch may read ahead of the app (and keep) while it waits.
BODY_LIMIT = 64 * 1024

_DISCONNECTS = frozenset({"http.disconnect", "websocket.disconnect"})


class ClientWatch:
    """Watches ``receive`` while a request waits; ``stop()`` gives the app its ``receive``.

    Called (as the guard's ``gone``), it starts reading once and returns the future
    that completes when the client leaves.
    """

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.kept: collections.deque[Message] = collections.deque()
        self.left: asyncio.Future[None] | None = None
        self.reader: asyncio.Task[None] | None = None

    def __call__(self) -> asyncio.Future[None]:
        if self.left is None:
            loop = asyncio.get_running_loop()
            self.left = loop.create_future()
            self.reader = loop.create_task(self._read(self.left))
        return self.left

    async def _read(self, left: asyncio.Future[None]) -> None:
        read = 0
        while read < BODY_LIMIT:
            message = await self.receive()
            # Kept at once: nothing can cancel the reader between the return and here.
            self.kept.append(message)
            if message["type"] in _DISCONNECTS:
                left.set_result(None)
                return
            read += len(message.get("body") or b"")

    async def stop(self) -> Receive:
        """Stop reading; the ``receive`` to give the app: the kept messages, then the server's."""
        reader = self.reader
        if reader is not None:
            reader.cancel()
            await asyncio.wait([reader])
            if not reader.cancelled():
                # A failed ``receive``: the app's next call asks the server, which fails
                # again if it must; the reader's error is not the app's to see.
                reader.exception()
        return self._replay if self.kept else self.receive

    async def _replay(self) -> Message:
        if self.kept:
            return self.kept.popleft()
        return await self.receive()


async def decide_watching(guard: Guard, connection: HTTPConnection) -> Ruling | None:
    """``guard.decide`` for the decorator and the dependency, the client watched while the
    request waits; None when it left. What the watch read goes back into the request's
    ``receive`` (Starlette keeps it in ``_receive``, with no public way to replace it)."""
    scope = connection.scope
    method = scope.get("method", "GET")
    if not isinstance(connection, Request | WebSocket):
        return await guard.decide(scope, method)
    watch = ClientWatch(connection._receive)
    try:
        return await guard.decide(scope, method, watch)
    except ClientGone:
        return None
    finally:
        connection._receive = await watch.stop()
