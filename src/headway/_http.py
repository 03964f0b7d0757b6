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
    "problem_body",
    "send_problem",
    "send_response",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Problem ``type`` URIs are ``PROBLEM_BASE + slug``; the slugs are stable API.
PROBLEM_BASE = "https://headway.dev/problems/"


def header_values(scope: Scope, name: bytes) -> list[bytes]:
    """Every value of the request header ``name`` (lower-case bytes), in order."""
    return [value for key, value in scope.get("headers", ()) if key.lower() == name]


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of request header ``name``, or None."""
    values = header_values(scope, name)
    return values[0] if values else None


async def send_response(
    send: Send, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes
) -> None:
    """Send a whole response (``content-length`` is set from ``body``)."""
    head = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    head.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


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
    """Send an RFC 9457 ``application/problem+json`` response with a stable ``type``."""
    problem = {"type": PROBLEM_BASE + slug, "title": title, "status": status, "detail": detail}
    problem.update(extensions)
    body = json.dumps(problem, separators=(",", ":")).encode()
    head = [(b"content-type", b"application/problem+json"), (b"cache-control", b"no-store")]
    await send_response(send, status, [*head, *headers], body)


#: Headers of every problem response: the media type, and never stored by a cache.
PROBLEM_HEADERS = ((b"content-type", b"application/problem+json"), (b"cache-control", b"no-store"))


def problem_body(
    status: int,
    type_uri: str,
    title: str,
    detail: str,
    extensions: Mapping[str, Any] | None = None,
) -> bytes:
    """An RFC 9457 problem document (any ``type`` URI, e.g. one from IANA's registry)."""
    problem: dict[str, Any] = {"type": type_uri, "title": title, "status": status}
    problem["detail"] = detail
    problem.update(extensions or {})
    return json.dumps(problem, separators=(",", ":")).encode()
