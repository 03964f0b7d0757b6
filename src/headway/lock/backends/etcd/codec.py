"""What the etcd gateway's JSON means, without httpx: keys in base64, refusals as errors."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["FAILED_PRECONDITION", "NOT_FOUND", "EtcdError", "Transport", "b64", "unb64"]

NOT_FOUND = 5  # gRPC NotFound: "requested lease not found"
FAILED_PRECONDITION = 9  # gRPC FailedPrecondition: "lease already exists"


class EtcdError(Exception):
    """etcd refused a request (not an outage): ``code`` is the gRPC status code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"etcd error {code}: {message}")
        self.code = code


def b64(text: str) -> str:
    """A key as the gateway expects it."""
    return base64.b64encode(text.encode()).decode()


def unb64(text: str) -> str:
    """A key as the gateway returns it."""
    return base64.b64decode(text).decode()


class Transport(Protocol):
    """How the backend reaches etcd: unary calls and one kind of watch, in the JSON
    gateway's shapes (keys base64, 64-bit integers as strings or ints)."""

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Call ``/v3/<path>`` with ``body``; the reply (``EtcdError`` if refused)."""
        ...

    async def deleted(
        self,
        key: str,
        seen: int,
        seconds: float | None,
        *,
        range_end: str | None = None,
        still: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """Return once ``key`` (present at revision ``seen``) is deleted, or after
        ``seconds`` (None: no bound); it may return early."""
        ...

    async def aclose(self) -> None:
        """Close the connections."""
        ...
