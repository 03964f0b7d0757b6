"""Redlock's fan-out: one script call to every node at once, each bounded by its timeout.

Calls go over headway's pipelined connections (``_redis.wire``), one per node and event
loop: a call is written to every node before the first reply is awaited, and calls
from concurrent tasks share writes. A node answers the calls of one connection in
order, so a release always runs after the acquire it undoes, even when that acquire's
reply came too late for its round.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors

from headway._redis.errors import UNAVAILABLE
from headway._redis.resp import Arg, Packed
from headway._redis.scripts import Script
from headway._redis.wire import Wires, forget

__all__ = ["NODE_ERRORS", "Nodes"]

#: A node that answers with an error (out of memory, read-only replica) is a no, like one that
#: does not answer; a bad argument on our side (DataError) is a bug and propagates.
NODE_ERRORS: tuple[type[BaseException], ...] = (*UNAVAILABLE, redis_errors.ResponseError)


def _label(index: int, client: Any) -> str:
    try:
        kwargs = client.connection_pool.connection_kwargs
    except AttributeError:
        return f"node {index}"
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


class Nodes:
    """The N independent servers of one Redlock, as ``redis.asyncio`` clients."""

    def __init__(self, clients: Sequence[Any], timeout: float) -> None:
        self.clients = list(clients)
        self.timeout = timeout
        self.wires = [Wires(client) for client in self.clients]
        self.labels = [_label(i, client) for i, client in enumerate(self.clients)]

    def __len__(self) -> int:
        return len(self.clients)

    def send(
        self, script: Script, keys: tuple[str, ...], args: Sequence[Arg] | Packed, node: int
    ) -> asyncio.Future[Any]:
        """Write one call to ``node`` now (or once connected); its reply's future."""
        wire = self.wires[node].ready_wire()
        if wire is not None:  # connected: written at once, the timeout on the wire's timer
            return wire.submit(script, keys, args, None, self.timeout)
        return asyncio.ensure_future(self.wires[node].call(script, keys, args, None, self.timeout))

    async def everywhere(
        self, script: Script, keys: tuple[str, ...], args: Sequence[Sequence[Arg] | Packed]
    ) -> list[Any]:
        """One reply per node, in node order: the result, or the exception that made it a no.

        ``args`` holds each node's arguments (the same object N times when they agree).
        """
        futures = [self.send(script, keys, a, i) for i, a in enumerate(args)]
        replies: list[Any] = []
        try:
            for future in futures:
                try:
                    replies.append(await future)
                except NODE_ERRORS as exc:
                    replies.append(exc)
        except BaseException:  # cancelled, or a bug: nobody waits for the other replies now
            for future in futures[len(replies) :]:
                forget(future)
            raise
        return replies

    def errors(self, replies: Sequence[Any]) -> str:
        """The nodes whose reply was an error, and why, for a message."""
        failed = [
            f"{label}: {self._describe(r)}"
            for label, r in zip(self.labels, replies, strict=True)
            if isinstance(r, BaseException)
        ]
        return "; node errors: " + "; ".join(failed) if failed else ""

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError | redis_errors.TimeoutError) and "within" not in str(exc):
            return f"no answer within {self.timeout:g} s"
        return f"{type(exc).__name__}: {exc}"

    async def aclose(self, owned: bool) -> None:
        """Close this loop's connections; the clients too if ``owned``."""
        for wires in self.wires:
            await wires.aclose()
        if owned:
            for client in self.clients:
                with contextlib.suppress(*UNAVAILABLE):
                    await client.aclose()
