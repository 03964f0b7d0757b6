"""A WebSocket chat whose clients may each send so much: messages, bytes and connections.

Serve it: ``python3 -m uv run uvicorn examples.websocket_chat:app``. Or run this file to
watch a polite client and a flooding one against it on a free local port:
``python3 -m uv run python examples/websocket_chat.py`` (the client is the ``websockets``
package, which ``uvicorn[standard]`` installs). The limits live in Redis when
HEADWAY_REDIS_URL is set, else in this process's memory.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from headway import (
    Concurrency,
    FixedWindow,
    MemoryRateLimitBackend,
    RateLimitBackend,
    RedisRateLimitBackend,
    TokenBucket,
    WebSocketRateLimitMiddleware,
    WebSocketRule,
)


def make_backend() -> RateLimitBackend:
    url = os.environ.get("HEADWAY_REDIS_URL")
    return RedisRateLimitBackend.from_url(url) if url else MemoryRateLimitBackend()


# Per client address (the socket peer: put ClientAddress(trusted_proxies=[...]) behind a
# proxy): 20 messages a minute, 2 connections at once, and 4 KiB at once refilled at
# 1 KiB/s, a message over that waiting up to 2 s for its turn.
RULES = [
    WebSocketRule({"messages": FixedWindow(20, 60), "connections": Concurrency(2)}, name="chat"),
    WebSocketRule(
        TokenBucket(4096, 1024), unit="byte", over="wait", max_wait=2.0, name="chat-bytes"
    ),
]
#: What the app received, by client name (``?name=`` in the URL).
RECEIVED: collections.Counter[str] = collections.Counter()


async def chat(websocket: WebSocket) -> None:
    name = websocket.query_params.get("name", "anonymous")
    await websocket.accept()
    with contextlib.suppress(WebSocketDisconnect):  # the client left, or the limit closed it
        while True:
            text = await websocket.receive_text()
            RECEIVED[name] += 1
            await websocket.send_text(f"{name}: {text}")


app = Starlette(
    routes=[WebSocketRoute("/chat", chat)],
    middleware=[Middleware(WebSocketRateLimitMiddleware, rules=RULES, backend=make_backend())],
)


async def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    serving = asyncio.create_task(server.serve([sock]))
    url = f"ws://127.0.0.1:{sock.getsockname()[1]}/chat"
    async with connect(f"{url}?name=polite", proxy=None) as polite:
        for i in range(5):
            await polite.send(f"hello {i}")
            await polite.recv()  # the echo
    async with connect(f"{url}?name=flood", proxy=None) as flood:
        with contextlib.suppress(ConnectionClosed):
            for i in range(1000):
                await flood.send(f"spam {i}")
        await flood.wait_closed()
    print(f"polite client: {RECEIVED['polite']} messages received by the app")
    print(
        f"flooding client: {RECEIVED['flood']} received, then closed with "
        f"{flood.close_code} ({flood.close_reason})"
    )
    server.should_exit = True
    await serving


if __name__ == "__main__":
    asyncio.run(main())
