"""ASGI helpers shared by the middlewares: types, headers, RFC 9457 problem responses."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

__all__ = [
    "PROBLEM_BASE",
    "PROBLEM_HEADERS",
    "ASGIApp",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "header",
    "header_values",
    "problem_json",
    "problem_response",
    "send_problem",
    "send_response",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: headway's own problem ``type`` URIs are ``PROBLEM_BASE + slug``; the slugs are stable API.
#: A ``tag:`` URI (RFC 4151): an identifier that is never dereferenced, under a name no one
#: else can ever hold (``.invalid`` is reserved, RFC 6761), so no stranger can serve a page
#: at it. Problems the IETF registered (``quota-exceeded``...) use IANA's URIs instead.
PROBLEM_BASE = "tag:headway.invalid,2026:problems/"


def header_values(scope: Scope, name: bytes) -> list[bytes]:
    """Every value of the request header ``name`` (lower-case bytes), in order."""
    return [value for key, value in scope.get("headers", ()) if key.lower() == name]


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of request header ``name``, or None."""
    values = header_values(scope, name)
    return values[0] if values else None


_RESPONSE = ("http.response.start", "http.response.body")
_DENIAL = ("websocket.http.response.start", "websocket.http.response.body")

#: Headers of every problem response: the media type, and never stored by a cache.
PROBLEM_HEADERS = ((b"content-type", b"application/problem+json"), (b"cache-control", b"no-store"))


async def send_response(
    send: Send,
    status: int,
    headers: Iterable[tuple[bytes, bytes]],
    body: bytes,
    *,
    websocket: bool = False,
) -> None:
    """Send a whole response (``content-length`` is set from ``body``).

    With ``websocket``, the response denies a WebSocket handshake (the ASGI
    WebSocket denial response extension).
    """
    head = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    head.append((b"content-length", str(len(body)).encode()))
    start, rest = _DENIAL if websocket else _RESPONSE
    await send({"type": start, "status": status, "headers": head})
    await send({"type": rest, "body": body})


def problem_response(
    status: int,
    type_uri: str,
    title: str,
    detail: str,
    *,
    headers: Iterable[tuple[bytes, bytes]] = (),
    extensions: Mapping[str, Any] | None = None,
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """An RFC 9457 problem response: status, headers (``PROBLEM_HEADERS``, then ``headers``), body.

    ``type_uri`` is any problem type (e.g. one from IANA's registry).
    """
    problem = {"type": type_uri, "title": title, "status": status, "detail": detail}
    if extensions:
        problem.update(extensions)
    return status, [*PROBLEM_HEADERS, *headers], problem_json(problem)


def problem_json(problem: Mapping[str, Any]) -> bytes:
    """The body of an ``application/problem+json`` response: ``problem``'s members, compact."""
    return json.dumps(problem, separators=(",", ":")).encode()


async def send_problem(
    send: Send,
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    headers: Iterable[tuple[bytes, bytes]] = (),
    **extensions: Any,
) -> None:
    """Send a ``problem_response`` with headway's stable ``type`` (``PROBLEM_BASE + slug``)."""
    problem = problem_response(
        status, PROBLEM_BASE + slug, title, detail, headers=headers, extensions=extensions
    )
    await send_response(send, *problem)
