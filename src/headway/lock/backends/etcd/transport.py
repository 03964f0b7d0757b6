"""What the backend needs from a way to reach etcd (``Transport``), and the rotation over
a cluster's members that both transports share (``Rotation``).

Two transports implement it, both in the ``etcd`` extra: ``gateway.Gateway`` (etcd's v3
JSON gateway over httpx) and ``grpc_transport.GrpcTransport`` (etcd's gRPC API over
grpcio, with ``proto.py``'s hand-written messages). Both take and return
the JSON gateway's shapes (keys base64, 64-bit integers as strings), so the backend
builds every request once.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol, TypeVar

from headway._errors import BackendUnavailable

__all__ = ["RETRY_CODES", "Retry", "Rotation", "Transport", "TransportName", "make_transport"]

T = TypeVar("T")
TransportName = Literal["auto", "grpc", "gateway"]

#: gRPC codes that mean "this member cannot answer now" (no leader, leader changed,
#: request timed out): another member, or the same one a moment later, may.
RETRY_CODES = frozenset({4, 14})
#: Pause after every endpoint failed once in a row, so a dead cluster is not spun on.
_BACKOFF = 0.05


class Transport(Protocol):
    """How the backend reaches etcd: unary calls and one kind of watch."""

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Call ``/v3/<path>`` (``kv/txn``, ``lease/grant``...) with ``body``; the reply
        (``EtcdError`` if refused, ``BackendUnavailable`` after the timeout)."""
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
        ``seconds`` (None: no bound). With ``range_end``, once any key in ``[key,
        range_end)`` is deleted, and ``still()`` says whether what was seen at ``seen``
        still holds (by default: ``key`` exists). It may return early (the stream broke,
        the key is gone already): callers look again, so an early return costs one more
        check, never a missed release."""
        ...

    async def aclose(self) -> None:
        """Close the connections."""
        ...


class Retry(Exception):
    """This member cannot answer now: try the next one."""


class Rotation:
    """The members of one cluster, tried in turn until one answers or time is up."""

    def __init__(self, endpoints: Sequence[str], timeout: float) -> None:
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self._at = 0  # the endpoint that answered last

    async def rotate(self, attempt: Callable[[int, float], Awaitable[T]]) -> T:
        """``attempt(endpoint index, seconds left)`` on each member in turn until one
        does not raise ``Retry``; ``BackendUnavailable`` once ``timeout`` has passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        failed: list[str] = []
        while True:
            at = self._at
            left = deadline - loop.time()
            if left <= 0:
                raise BackendUnavailable(
                    f"etcd did not answer within {self.timeout:g} s ({'; '.join(failed[-3:])})",
                    backend="etcd",
                )
            try:
                return await attempt(at, left)
            except Retry as exc:
                failed.append(f"{self.endpoints[at]}: {exc}")
            # Move on to the next member; after a full round, pause briefly.
            self._at = (at + 1) % len(self.endpoints)
            if len(failed) % len(self.endpoints) == 0:
                await asyncio.sleep(min(_BACKOFF, max(0.0, deadline - loop.time())))


def make_transport(name: TransportName, endpoints: Sequence[str], timeout: float) -> Transport:
    """The transport ``name`` (see ``EtcdLockBackend``); its client library is imported
    only here, when a backend is made."""
    if name not in ("auto", "grpc", "gateway"):
        raise ValueError(f"transport must be 'auto', 'grpc' or 'gateway', not {name!r}")
    if name == "grpc" or (name == "auto" and importlib.util.find_spec("grpc") is not None):
        from headway.lock.backends.etcd.grpc_transport import GrpcTransport

        return GrpcTransport(endpoints, timeout)
    from headway.lock.backends.etcd.gateway import Gateway

    return Gateway(endpoints, timeout)
