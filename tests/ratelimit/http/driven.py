"""Requests driven by hand as ASGI calls: a ``receive`` the test controls (body chunks,
then a disconnect when told), a ``send`` that records, and the order of arrival."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Sequence
from typing import Any

from headway import RateLimitEvent
from headway._http import Message

#: The order in which this task's request reached the app.
ARRIVAL: contextvars.ContextVar[int] = contextvars.ContextVar("arrival")


class Client:
    """One request driven by hand: the body it sends, a switch to disconnect, what it got."""

    def __init__(self, chunks: Sequence[bytes] = (b"",), method: str = "GET") -> None:
        self.chunks = list(chunks)
        self.method = method
        self.leave = asyncio.Event()
        #: Set when someone asks for a message after the whole body (a disconnect watch).
        self.watched = asyncio.Event()
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = b""
        self.answered_at: float | None = None

    async def receive(self) -> Message:
        if self.chunks:
            chunk = self.chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}
        self.watched.set()
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode(): v.decode() for k, v in message.get("headers", ())}
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")
            if not message.get("more_body", False):
                self.answered_at = time.monotonic()

    def scope(self, path: str) -> dict[str, Any]:
        return {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": self.method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "headers": [(b"host", b"test")],
            "client": ("192.0.2.1", 40000), "server": ("test", 80),
        }  # fmt: skip


class Admissions:
    """The ``on_decision`` hook: each decision with the arrival of its request, and when."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str, float]] = []

    def __call__(self, event: RateLimitEvent) -> None:
        self.events.append((ARRIVAL.get(-1), event.outcome, time.monotonic()))

    def of(self, outcome: str) -> list[tuple[int, float]]:
        return [(n, t) for n, o, t in self.events if o == outcome]
