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

from headway.lock.backends.etcd.codec import EtcdError, b64
from headway.lock.backends.etcd.transport import RETRY_CODES, Retry, Rotation

__all__ = ["Gateway"]


class Gateway(Rotation):
    """Calls to one etcd cluster through the JSON gateway of any of its ``endpoints``."""

    def __init__(self, endpoints: Sequence[str], timeout: float) -> None:
        super().__init__(endpoints, timeout)
        # No pool cap: each waiting task holds one connection for its watch.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._http = httpx.AsyncClient(timeout=timeout, limits=limits)

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>`` and return the reply (``EtcdError`` if refused)."""
        return await self.rotate(functools.partial(self._post, path, body))

    async def _post(self, path: str, body: dict[str, Any], at: int, left: float) -> dict[str, Any]:
        try:
            reply = await self._http.post(
                f"{self.endpoints[at]}/v3/{path}", json=body, timeout=left
            )
            data = reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise Retry(type(exc).__name__) from exc
        if "error" not in data and "code" not in data:
            return dict(data.get("result", data))
        code = int(data.get("code", 2))
        if code in RETRY_CODES:
            raise Retry(str(data.get("message")))
        raise EtcdError(code, str(data.get("message", data)))

    async def deleted(
        self,
        key: str,
        seen: int,
        seconds: float | None,
        *,
        range_end: str | None = None,
        still: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """See ``Transport.deleted``."""
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
