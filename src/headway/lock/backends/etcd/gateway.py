"""A small async client for etcd's v3 JSON gateway (``/v3/...`` on the client port).

Only what the lock needs: unary calls (``call``) and one watch for a key's DELETE
(``deleted``). Keys and values travel base64-encoded, 64-bit integers as strings
(grpc-gateway's JSON mapping). Every call is bounded by ``timeout``: an endpoint
that refuses, stalls or answers "no leader" is left for the next one, and when the
time is up the caller gets ``BackendUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from headway._errors import BackendUnavailable
from headway.lock.backends.etcd.codec import EtcdError, b64

__all__ = ["Gateway"]

#: gRPC codes that mean "this member cannot answer now" (no leader, leader changed,
#: request timed out): another member, or the same one a moment later, may.
_RETRY_CODES = frozenset({4, 14})
#: Pause after every endpoint failed once in a row, so a dead cluster is not spun on.
_BACKOFF = 0.05


class Gateway:
    """Calls to one etcd cluster through the JSON gateway of any of its ``endpoints``."""

    def __init__(self, endpoints: Sequence[str], timeout: float) -> None:
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self._at = 0  # the endpoint that answered last
        # No pool cap: each waiting task holds one connection for its watch.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._http = httpx.AsyncClient(timeout=timeout, limits=limits)

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>`` and return the reply (``EtcdError`` if refused)."""
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
                reply = await self._http.post(
                    f"{self.endpoints[at]}/v3/{path}", json=body, timeout=left
                )
                data = reply.json()
            except (httpx.HTTPError, ValueError) as exc:
                failed.append(f"{self.endpoints[at]}: {type(exc).__name__}")
            else:
                if "error" not in data and "code" not in data:
                    return dict(data.get("result", data))
                code = int(data.get("code", 2))
                if code not in _RETRY_CODES:
                    raise EtcdError(code, str(data.get("message", data)))
                failed.append(f"{self.endpoints[at]}: {data.get('message')}")
            # Move on to the next member; after a full round, pause briefly.
            self._at = (at + 1) % len(self.endpoints)
            if len(failed) % len(self.endpoints) == 0:
                await asyncio.sleep(min(_BACKOFF, max(0.0, deadline - loop.time())))

    async def deleted(
        self,
        key: str,
        seen: int,
        seconds: float | None,
        *,
        range_end: str | None = None,
        still: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """Return once ``key`` (present at revision ``seen``) is deleted, or after ``seconds``
        (None: no bound).

        With ``range_end``, once any key in ``[key, range_end)`` is deleted, and
        ``still()`` says whether what was seen at ``seen`` still holds (by default:
        ``key`` exists). It may return early (the stream broke, the key is gone
        already): callers look again, so an early return costs one more check, never a
        missed release.
        """
        # The watch starts at the current revision, not at ``seen + 1``: etcd serves
        # a watch that starts in the past from a loop that runs every 100 ms, which
        # would be most of a handover. What happened in between is looked up instead.
        request: dict[str, Any] = {"key": b64(key), "filters": ["NOPUT"]}
        if range_end is not None:
            request["range_end"] = b64(range_end)
        body = {"create_request": request}
        if still is None:
            still = functools.partial(self._exists, key)
        url = f"{self.endpoints[self._at]}/v3/watch"
        with contextlib.suppress(TimeoutError, httpx.HTTPError, ValueError):
            async with asyncio.timeout(seconds):
                timeout = httpx.Timeout(self.timeout, read=None)
                # A member that loses its leader ends the watch (it would see no more
                # events): gRPC metadata "hasleader", passed on by the gateway.
                headers = {"Grpc-Metadata-hasleader": "true"}
                stream = self._http.stream("POST", url, json=body, timeout=timeout, headers=headers)
                async with stream as reply:
                    async for line in reply.aiter_lines():
                        result = json.loads(line).get("result")
                        if result is None or result.get("events") or result.get("canceled"):
                            return
                        moved = result.get("created") and int(result["header"]["revision"]) > seen
                        if moved and not await still():
                            return

    async def _exists(self, key: str) -> bool:
        reply = await self.call("kv/range", {"key": b64(key), "count_only": True})
        return int(reply.get("count", 0)) > 0

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()
