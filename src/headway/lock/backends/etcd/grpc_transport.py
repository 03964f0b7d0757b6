"""etcd's gRPC API over grpcio (in the ``etcd`` extra), with ``proto.py``'s messages.

The same calls as the JSON gateway (``gateway.py``), in the same shapes, straight to the
member's gRPC server: no HTTP/1.1 round trip through the gateway, no JSON. Calls go
through grpcio's generic ``unary_unary``/``stream_stream`` with our own serializers, so
nothing is generated. One channel per member (HTTP/2: every call and watch of the
backend shares its connection); a member that is down, has no leader or times out is
left for the next, as the gateway's is.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import grpc
from grpc import aio

from headway.lock.backends.etcd import proto
from headway.lock.backends.etcd.codec import EtcdError, b64
from headway.lock.backends.etcd.transport import RETRY_CODES, Retry, Rotation

__all__ = ["GrpcTransport"]

#: The gateway's paths as gRPC methods: (method, request message, reply message).
_UNARY: dict[str, tuple[str, proto.Message, proto.Message]] = {
    "kv/range": ("/etcdserverpb.KV/Range", proto.RANGE, proto.RANGE_REPLY),
    "kv/put": ("/etcdserverpb.KV/Put", proto.PUT, proto.PUT_REPLY),
    "kv/deleterange": ("/etcdserverpb.KV/DeleteRange", proto.DELETE, proto.DELETE_REPLY),
    "kv/txn": ("/etcdserverpb.KV/Txn", proto.TXN, proto.TXN_REPLY),
    "lease/grant": ("/etcdserverpb.Lease/LeaseGrant", proto.LEASE_GRANT, proto.LEASE_GRANT_REPLY),
    "lease/revoke": ("/etcdserverpb.Lease/LeaseRevoke", proto.LEASE_ID, proto.LEASE_REPLY),
    # LeaseTimeToLiveResponse starts as LeaseKeepAliveResponse does (header, ID, TTL).
    "lease/timetolive": (
        "/etcdserverpb.Lease/LeaseTimeToLive",
        proto.LEASE_ID,
        proto.LEASE_REPLY,
    ),
}
_KEEPALIVE = "/etcdserverpb.Lease/LeaseKeepAlive"
_WATCH = "/etcdserverpb.Watch/Watch"
#: A member that loses its leader ends the watch (it would see no more events).
_REQUIRE_LEADER = (("hasleader", "true"),)


def _bytes(data: bytes) -> bytes:
    return data


class GrpcTransport(Rotation):
    """Calls to one etcd cluster through the gRPC server of any of its ``endpoints``
    (client URLs: ``http://`` in the clear, ``https://`` with the system's roots)."""

    def __init__(self, endpoints: Sequence[str], timeout: float) -> None:
        super().__init__(endpoints, timeout)
        self._channels: list[aio.Channel | None] = [None] * len(self.endpoints)

    def _channel(self, at: int) -> aio.Channel:
        channel = self._channels[at]
        if channel is None:
            url = urlsplit(self.endpoints[at])
            target = url.netloc or self.endpoints[at]
            if url.scheme == "https":
                channel = aio.secure_channel(target, grpc.ssl_channel_credentials())
            else:
                channel = aio.insecure_channel(target)
            self._channels[at] = channel
        return channel

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Call the gRPC method of gateway path ``path`` (``EtcdError`` if refused)."""
        return await self.rotate(functools.partial(self._call, path, body))

    async def _call(self, path: str, body: dict[str, Any], at: int, left: float) -> dict[str, Any]:
        channel = self._channel(at)
        try:
            if path == "lease/keepalive":  # a stream: one request, its first answer
                stream = channel.stream_stream(_KEEPALIVE, _bytes, _bytes)
                call = stream(iter([proto.encode(proto.LEASE_ID, body)]), timeout=left)
                try:
                    data = await call.read()
                finally:
                    call.cancel()
                return {} if data is aio.EOF else proto.decode(proto.LEASE_REPLY, data)
            method, request, reply = _UNARY[path]
            unary = channel.unary_unary(method, _bytes, _bytes)
            data = await unary(proto.encode(request, body), timeout=left)
            return proto.decode(reply, data)
        except aio.AioRpcError as exc:
            code = exc.code().value[0]
            # The server hit the deadline we sent it (our own timeout): it reports the
            # context's error as Unknown, which means "no answer in time" all the same.
            late = code == 2 and "deadline exceeded" in (exc.details() or "")
            if code in RETRY_CODES or late:
                raise Retry(exc.details() or exc.code().name) from exc
            raise EtcdError(code, exc.details() or exc.code().name) from exc

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
        # As the gateway's: from the current revision, what happened since ``seen``
        # looked up (a watch from the past is served by a 100 ms loop).
        create: dict[str, Any] = {"key": b64(key), "filters": ["NOPUT"]}
        if range_end is not None:
            create["range_end"] = b64(range_end)
        if still is None:
            still = functools.partial(self._exists, key)
        stream = self._channel(self._at).stream_stream(_WATCH, _bytes, _bytes)
        call = stream(metadata=_REQUIRE_LEADER)
        try:
            with contextlib.suppress(TimeoutError, aio.AioRpcError):
                async with asyncio.timeout(seconds):
                    await call.write(proto.encode(proto.WATCH, {"create_request": create}))
                    while (data := await call.read()) is not aio.EOF:
                        result = proto.decode(proto.WATCH_REPLY, data)
                        if result.get("events") or result.get("canceled"):
                            return
                        moved = result.get("created") and int(result["header"]["revision"]) > seen
                        if moved and not await still():
                            return
        finally:
            call.cancel()

    async def _exists(self, key: str) -> bool:
        reply = await self.call("kv/range", {"key": b64(key), "count_only": True})
        return int(reply.get("count", 0)) > 0

    async def aclose(self) -> None:
        """Close the channels."""
        channels = [c for c in self._channels if c is not None]
        self._channels = [None] * len(self.endpoints)
        await asyncio.gather(*(c.close() for c in channels))
