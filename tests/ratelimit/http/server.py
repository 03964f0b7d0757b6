"""A real uvicorn server for the middleware tests, on a free loopback port."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import uvicorn


@asynccontextmanager
async def serving(app: Any, host: str = "127.0.0.1", **config: Any) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on a socket bound before it starts (no wait for readiness).

    Yields ``http://host:port``. WebSocket connections are served by uvicorn's
    ``websockets`` (sans-I/O) protocol. ``config`` goes to ``uvicorn.Config``.
    """
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen(128)  # connections queue in the backlog until uvicorn accepts them
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", **config))
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve, [sock])
        try:
            yield f"http://{host}:{port}"
        finally:
            server.should_exit = True
    sock.close()
