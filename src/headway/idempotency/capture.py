"""Capture a response while it streams to the client, holding back only its end."""

from __future__ import annotations

from headway._http import Message, Receive, Send

__all__ = ["Capture", "read_body", "replaying"]


class Capture:
    """Wraps ``send``: forwards the response as it comes, keeps a copy up to ``limit`` bytes.

    The last body message (``more_body`` false) is held back in ``final`` so the
    caller can store the response before the client sees it complete: a client
    that received a whole response can count on a retry replaying it.
    """

    def __init__(self, send: Send, limit: int) -> None:
        self._send = send
        self._limit = limit
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.size = 0
        self.final: Message | None = None

    @property
    def started(self) -> bool:
        return self.status is not None

    @property
    def body(self) -> bytes | None:
        """The captured body, or None if it outgrew the limit."""
        return None if self.size > self._limit else b"".join(self.chunks)

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
        elif message["type"] == "http.response.body":
            chunk = bytes(message.get("body", b""))
            self.size += len(chunk)
            if self.size <= self._limit:
                self.chunks.append(chunk)
            else:
                self.chunks.clear()
            if not message.get("more_body", False):
                self.final = message
                return
        await self._send(message)

    async def finish(self) -> None:
        """Let the held-back end of the response through."""
        if self.final is not None:
            final, self.final = self.final, None
            await self._send(final)


class BodyTooLarge(Exception):
    """The request body is longer than the middleware's ``max_request_body``."""


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None if the client disconnected first.

    The body must be read whole to fingerprint it before deciding anything, so it is
    bounded: past ``limit`` bytes ``BodyTooLarge`` is raised and nothing more is read.
    """
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the already-read ``body``, then defers to the client's."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
