"""Script calls from sync code on sockets headway drives itself (``SyncWire``).

Requests are packed and framed as on the async side (``_redis.resp``), sent as
``FCALL`` and, where needed, again after loading the library or as ``EVALSHA`` /
``EVAL`` (``_redis.scripts``); a socket serves one thread's call at a time (a call,
then its reply), so there is nothing to pipeline.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import hiredis
from redis import cluster as redis_cluster
from redis import exceptions as redis_errors

from headway._redis.resp import REQUEST, Arg, Packed, refused, reply_error, tail, unpacked
from headway._redis.scripts import (
    EVALSHA,
    FCALL,
    LOAD,
    Script,
    functions_refused,
    load_failed,
    resend_stage,
)

if TYPE_CHECKING:
    from headway._redis.sync_cluster_wire import SyncClusterWire

__all__ = ["SyncWire"]

_ASKING = b"*1\r\n$6\r\nASKING\r\n"


class _SyncConnection:
    """One socket taken over from a sync redis-py connection: a call, then its reply."""

    def __init__(self, borrowed: Any, wire: SyncWire) -> None:
        self.borrowed = borrowed  # kept, so its __del__ closes the socket with it
        self.sock = borrowed._sock
        self.reader = hiredis.Reader(replyError=reply_error)
        self.wire = wire  # whose ``functions`` says how calls are sent

    def call(
        self,
        script: Script,
        keys: Sequence[str] | Packed,
        args: Sequence[Arg] | Packed,
        asking: bool = False,
    ) -> Any:
        elements, packed = tail(keys, args)
        stage = FCALL if self.wire.functions else EVALSHA
        while True:
            data = REQUEST % (elements, script.head(stage), packed)
            # After a Cluster's ASK, ``ASKING`` goes right before the call; a library's
            # load before both. Their replies are read first (a refused load is logged).
            if asking:
                data = _ASKING + data
            if stage == LOAD:
                data = script.load_request + data
            self.sock.sendall(data)
            if stage == LOAD and load_failed(self._reply()):
                self.wire.functions = False
            if asking:
                self._reply()
            reply = self._reply()
            following = resend_stage(stage, reply) if isinstance(reply, Exception) else None
            if following is None:
                return reply
            if functions_refused(reply):
                self.wire.functions = False
            stage = following

    def _reply(self) -> Any:
        while (reply := self.reader.gets()) is False:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise redis_errors.ConnectionError("Connection closed by Redis.")
            self.reader.feed(chunk)
        return reply

    def close(self) -> None:
        self.borrowed.disconnect()


class SyncWire:
    """The sync counterpart of ``Wire``: script calls on sockets headway drives itself.

    Each call takes an idle connection (or opens one with redis-py, from the client's
    settings), writes the call, reads its reply and puts the connection back, so
    threads never share one mid-call. A connection that fails mid-call is closed: what
    became of its call is unknown. ``enabled=False`` sends every call through
    redis-py. A Cluster client's calls go to a ``SyncClusterWire``, which
    routes each to its slot's primary over a ``SyncWire`` per node.
    """

    def __init__(self, client: Any, enabled: bool = True) -> None:
        from headway._redis.sync_cluster_wire import SyncClusterWire  # here: it imports us

        self.client = client
        self.enabled = enabled
        self._cluster: SyncClusterWire | None = None
        if isinstance(client, redis_cluster.RedisCluster):
            self._cluster = SyncClusterWire(client, enabled)
        self.functions = True  # False once the server answered that it runs none
        self.requests = 0
        self._idle: list[_SyncConnection] = []
        self._pid = os.getpid()

    def call(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg] | Packed,
        asking: bool = False,
    ) -> Any:
        """Run ``script`` and return its reply (an error reply is raised).

        ``asking``: the call follows a Cluster's ASK (``ASKING`` precedes it).
        """
        if self._cluster is not None:
            return self._cluster.call(script, keys, args)
        connection: _SyncConnection | None = None
        if self.enabled:
            if os.getpid() != self._pid:  # forked: the parent's sockets are not ours to use
                self._idle, self._pid = [], os.getpid()
            try:
                connection = self._idle.pop()  # atomic: threads never get the same one
            except IndexError:
                connection = self._open()  # None: this client's cannot be driven
        if connection is None:
            if asking:  # ASKING on the call's connection: one pipeline (EVAL: no NOSCRIPT)
                pipe = self.client.pipeline(transaction=False)
                pipe.execute_command("ASKING")
                pipe.eval(script.source, len(keys), *keys, *unpacked(args))
                return pipe.execute()[1]
            return script.run_sync(self.client, keys, unpacked(args))
        self.requests += 1
        try:
            reply = connection.call(script, keys, args, asking)
        except BaseException:
            connection.close()
            raise
        self._idle.append(connection)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _open(self) -> _SyncConnection | None:
        borrowed = self.client.connection_pool.make_connection()
        borrowed.connect()
        if getattr(borrowed, "_sock", None) is None:
            borrowed.disconnect()
            self.enabled = False
            refused(borrowed)
            return None
        return _SyncConnection(borrowed, self)

    def close(self) -> None:
        """Close the idle connections (one still in a call closes when it is collected)."""
        if self._cluster is not None:
            self._cluster.close()
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
