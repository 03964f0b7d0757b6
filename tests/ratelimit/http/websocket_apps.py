"""A WebSocket app that records what it receives, and a client for it (``websockets``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from headway import WebSocketRateLimitMiddleware


class Recorder:
    """What the app saw: messages by client (``?c=`` in the URL), connections, disconnects.

    ``ended`` holds each ``/ws`` handler's disconnect code as it ends: once a code is
    there, the middleware has relayed that disconnect, slots released first.
    """

    def __init__(self) -> None:
        self.received: dict[str, list[str | bytes]] = {}
        self.accepted = 0
        self.late: list[int] = []  # the code of the disconnect a send after the end raised
        self.ended: asyncio.Queue[int] = asyncio.Queue()
        self.release_push = anyio.Event()  # lets the handlers of /push end

    async def echo(self, websocket: WebSocket) -> None:
        """Record each message; answer ``"count"`` with how many this client sent."""
        client = websocket.query_params.get("c", "-")
        seen = self.received.setdefault(client, [])
        await websocket.accept()
        self.accepted += 1
        while (message := await websocket.receive())["type"] != "websocket.disconnect":
            data = message["text"] if message.get("text") is not None else message["bytes"]
            seen.append(data)
            if data == "count":
                await websocket.send_text(str(len(seen)))
        try:
            await websocket.send_text("late")
        except WebSocketDisconnect as late:
            self.late.append(late.code)
        self.ended.put_nowait(message["code"])

    async def push(self, websocket: WebSocket) -> None:
        """Never read: wait, then try to send (the socket has long gone)."""
        await websocket.accept()
        self.accepted += 1
        await self.release_push.wait()
        with contextlib.suppress(WebSocketDisconnect):
            await websocket.send_text("bye")


def websocket_app(recorder: Recorder, **options: Any) -> Starlette:
    """``/ws`` (and ``/trusted``) echo and record, ``/push`` never reads; behind the
    WebSocket middleware."""
    routes = [
        WebSocketRoute("/ws", recorder.echo),
        WebSocketRoute("/trusted", recorder.echo),
        WebSocketRoute("/push", recorder.push),
    ]
    middleware = [Middleware(WebSocketRateLimitMiddleware, **options)]
    return Starlette(routes=routes, middleware=middleware)


@contextlib.asynccontextmanager
async def client(
    url: str,
    path: str = "/ws",
    *,
    name: str = "-",
    source: str = "127.0.0.1",
    headers: dict[str, str] | None = None,
) -> AsyncIterator[ClientConnection]:
    """A WebSocket client of ``url`` (``http://host:port``) from the address ``source``."""
    address = f"{url.replace('http://', 'ws://')}{path}?c={name}"
    async with connect(
        address, additional_headers=headers, local_addr=(source, 0), proxy=None
    ) as websocket:
        yield websocket


async def send_all(websocket: ClientConnection, messages: Sequence[str | bytes]) -> int:
    """Send ``messages`` as fast as possible; how many were written before the close."""
    sent = 0
    with contextlib.suppress(ConnectionClosed):
        for message in messages:
            await websocket.send(message)
            sent += 1
    return sent


async def closed_with(websocket: ClientConnection) -> int | None:
    """Wait for the server to close ``websocket``; the close code it sent."""
    await websocket.wait_closed()
    return websocket.close_code
