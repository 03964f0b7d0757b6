"""Script calls on a Redis Cluster over headway's pipelined connections, one per node.

Every call headway makes touches the keys of one hash tag, so it belongs to one slot
and runs on that slot's primary. ``ClusterWire`` has ``Wire``'s interface (``Wires``
picks it for a ``redis.asyncio.RedisCluster``): it routes each call by the slot of
its first key through the slot map the client keeps (redis-py's ``nodes_manager``),
on a ``PipelinedConnection`` per node opened with the client's connection settings.
What the Cluster answers:

- MOVED (the slot has a new owner: a resharding ended, or a failover): redis-py's map
  is updated for that slot (``move_slot``) and the call goes to the new owner.
- ASK (the slot is migrating and the keys are on the importing node): the call goes
  there, once, preceded by ``ASKING`` in the same write; the map stays as it is.
- TRYAGAIN (mid-migration, the call's keys are split between the two nodes): the
  call is routed afresh after a short pause.

Those replies mean the call did not run, so sending it again is safe; after
``MAX_REDIRECTS`` it fails with ``ClusterError`` (one of ``UNAVAILABLE``). A lost
connection fails the calls in flight with ``ConnectionError`` (outcome unknown), as
on one node, and the next call to that node reconnects; a node that cannot be
reached makes the wire refresh the whole map in the background, so after a failover
calls find the promoted replica. ``SyncClusterWire`` (``_redis.sync_cluster_wire``)
is the same for sync clients.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio.cluster import ClusterNode
from redis.cluster import PRIMARY, get_node_name
from redis.crc import key_slot

from headway._redis.connection import Orphan, PipelinedConnection, ScriptCall, take_over
from headway._redis.errors import UNAVAILABLE
from headway._redis.resp import Arg, Packed, refused, tail
from headway._redis.scripts import Script
from headway._redis.wire import reply_of, through_redis_py

__all__ = ["MAX_REDIRECTS", "ClusterWire", "slot_of"]

log = logging.getLogger("headway")

#: Redirections (MOVED, ASK, TRYAGAIN) one call follows before it fails.
MAX_REDIRECTS = 8
_TRY_AGAIN_PAUSE = 0.02  # seconds: a migration moves a hash tag's keys in one MIGRATE
_REFRESH_PAUSE = 0.05  # seconds between two refreshes of the slot map


def slot_of(keys: Sequence[str] | Packed) -> int:
    """The Cluster slot of a call: its first key's (all of a call's keys share a hash tag)."""
    first = keys.values[0] if isinstance(keys, Packed) else keys[0]
    return key_slot(first.encode() if isinstance(first, str) else bytes(first))  # type: ignore[arg-type]


def _fail(call: ScriptCall, error: BaseException) -> None:
    if not call.future.done():
        call.future.set_exception(error)


class ClusterWire:
    """Script calls on one Cluster client and event loop: a pipelined connection per node.

    ``ready`` once the slot map is known (the first ``call`` connects); ``submit``
    then always writes, at once on a connected node, else as soon as the node's
    connection is open. ``requests`` and ``writes`` count over every node.
    """

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.supported = True
        self.functions = True
        self.requests = 0
        self.writes = 0
        self._mapped = False
        self._connections: dict[str, PipelinedConnection] = {}  # by node name
        # The connection each slot was last routed to: the hot path skips redis-py's
        # map. Forgotten on every MOVED and map refresh; a stale entry costs a MOVED.
        self._by_slot: dict[int, PipelinedConnection] = {}
        # The nodes and redis-py connections whose sockets we drive, by node name.
        self._borrowed: dict[str, tuple[Any, Any]] = {}
        self._opening: dict[str, asyncio.Task[PipelinedConnection]] = {}
        self._connecting = asyncio.Lock()
        self._refreshing: asyncio.Task[None] | None = None
        self._refreshed = float("-inf")
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def ready(self) -> bool:
        """True once the slot map is known: ``submit`` writes every call from then on."""
        return self._mapped

    def submit(
        self,
        script: Script,
        keys: Sequence[str] | Packed,
        args: Sequence[Arg] | Packed,
        orphan: Orphan | None = None,
        timeout: float | None = None,
        always: bool = False,
    ) -> asyncio.Future[Any]:
        """Send one call to its slot's primary; the future of its reply (see ``Wire.submit``)."""
        elements, packed = tail(keys, args)
        call = ScriptCall(
            self.loop.create_future(), script, elements, packed, orphan, timeout, always
        )
        call.slot = slot_of(keys)
        if timeout is not None:  # kept across redirections and a connection being opened
            call.deadline = self.loop.time() + timeout
        connection = self._by_slot.get(call.slot)
        if connection is not None and not connection.lost:
            connection.send(call)
        else:
            self._route(call)
        return call.future

    async def call(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg] | Packed,
        orphan: Orphan | None = None,
        always: bool = False,
    ) -> Any:
        """Run ``script`` and return its reply (see ``Wire.call``)."""
        if not self._mapped:
            await self._connect()
            if not self.supported:
                return await through_redis_py(self.client, script, keys, args, orphan, always)
        future = self.submit(script, keys, args, orphan, None, always)
        return await reply_of(future, None if always else orphan)

    def redirected(self, call: ScriptCall, error: Exception) -> bool:
        """Send ``call`` where the Cluster says (MOVED, ASK) or again (TRYAGAIN)."""
        call.redirects += 1
        if call.redirects > MAX_REDIRECTS:
            _fail(
                call, redis_errors.ClusterError(f"still redirected after {MAX_REDIRECTS}: {error}")
            )
        elif isinstance(error, redis_errors.MovedError):
            call.asking = False
            self._by_slot.clear()
            self._spawn(self._moved(call, error))
        elif isinstance(error, redis_errors.AskError):
            call.asking = True
            self._send(call, error.host, error.port)
        else:  # TRYAGAIN: the migration of the call's keys is under way
            call.asking = False
            self.loop.call_later(_TRY_AGAIN_PAUSE, self._route, call)
        return True

    def _route(self, call: ScriptCall) -> None:
        try:
            node = self.client.nodes_manager.get_node_from_slot(call.slot)
        except redis_errors.SlotNotCoveredError as exc:
            self._refresh()
            _fail(call, redis_errors.ClusterError(str(exc)))
            return
        connection = self._send(call, node.host, node.port)
        if connection is not None:
            self._by_slot[call.slot] = connection

    def _send(self, call: ScriptCall, host: str, port: int) -> PipelinedConnection | None:
        # The connection it was written on; None if it waits for one to open.
        connection = self._connections.get(get_node_name(host, port))
        if connection is not None and not connection.lost:
            connection.send(call)
            return connection
        self._spawn(self._send_when_open(call, host, port))
        return None

    async def _send_when_open(self, call: ScriptCall, host: str, port: int) -> None:
        try:
            opening = asyncio.shield(self._open(host, port))
            if call.timeout is None:
                connection = await opening
            else:
                connection = await asyncio.wait_for(opening, call.deadline - self.loop.time())
        except asyncio.CancelledError:  # the wire was closed: the call is not written
            _fail(call, redis_errors.ConnectionError("the Cluster connection was closed"))
            raise
        except Exception as exc:
            self._refresh()  # the node may be gone: ask the Cluster who serves its slots
            if isinstance(exc, UNAVAILABLE):
                _fail(call, exc)
            else:
                _fail(call, redis_errors.ConnectionError(f"cannot connect to {host}:{port}: {exc}"))
            return
        connection.send(call)

    async def _moved(self, call: ScriptCall, error: redis_errors.AskError) -> None:
        try:
            await self.client.nodes_manager.move_slot(error)
        except asyncio.CancelledError:  # the wire was closed: the call is not written
            _fail(call, redis_errors.ConnectionError("the Cluster connection was closed"))
            raise
        except Exception:  # the routing below still follows redis-py's map, whatever it holds
            log.exception("updating the Cluster slot map after MOVED failed")
        self._route(call)

    def _open(self, host: str, port: int) -> asyncio.Task[PipelinedConnection]:
        # One connection attempt per node, whatever number of calls wait for it.
        name = get_node_name(host, port)
        opening = self._opening.get(name)
        if opening is None:
            opening = self._opening[name] = self.loop.create_task(self._open_node(host, port))
            opening.add_done_callback(lambda done: self._forget_opening(name, done))
        return opening

    def _forget_opening(self, name: str, done: asyncio.Task[Any]) -> None:
        if self._opening.get(name) is done:
            del self._opening[name]
        if not done.cancelled():
            done.exception()  # retrieved: the callers waiting got it

    async def _open_node(self, host: str, port: int) -> PipelinedConnection:
        # A connection from the node's pool in the client, so closing the client closes it.
        name = get_node_name(host, port)
        manager = self.client.nodes_manager
        old = self._borrowed.pop(name, None)
        if old is not None:  # its socket is gone: hand what is left of it back
            await old[1].disconnect(nowait=True)
            old[0].release(old[1])
        node = manager.get_node(node_name=name)
        if node is None:  # not in the map yet (an ASK to a new node): as redis-py adds one
            node = ClusterNode(host, port, PRIMARY, **manager.connection_kwargs)
            manager.set_nodes(manager.nodes_cache, {name: node})
        borrowed = node.acquire_connection()
        try:
            await borrowed.connect()
            connection = take_over(self, borrowed)
        except BaseException:
            await borrowed.disconnect(nowait=True)
            node.release(borrowed)
            raise
        if connection is None:
            self.supported = False
            node.release(borrowed)
            refused(borrowed)
            raise redis_errors.ConnectionError(f"cannot drive {borrowed!r} directly")
        self._borrowed[name], self._connections[name] = (node, borrowed), connection
        return connection

    async def _connect(self) -> None:
        # The map, and a connection to every primary, so the first calls go at once.
        async with self._connecting:
            if self._mapped or not self.supported:
                return
            try:
                await self.client.initialize()
            except redis_errors.RedisClusterException as exc:
                raise redis_errors.ClusterError(str(exc)) from exc
            primaries = self.client.get_primaries()
            await asyncio.gather(
                *(self._open(node.host, node.port) for node in primaries),
                return_exceptions=True,  # a node down: its calls will say so
            )
            self._mapped = self.supported

    def _refresh(self) -> None:
        if self._refreshing is not None or self.loop.time() - self._refreshed < _REFRESH_PAUSE:
            return
        self._refreshing = self._spawn(self._reinitialize())

    async def _reinitialize(self) -> None:
        try:
            await self.client.nodes_manager.initialize()
            self._by_slot.clear()
        except Exception as exc:  # no node answered: the next failure asks again
            log.debug("refreshing the Cluster slot map failed: %s", exc)
        finally:
            self._refreshed = self.loop.time()
            self._refreshing = None

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self.loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        """Close every node's connection (the client and its pools stay the caller's)."""
        async with self._connecting:
            self._mapped = False
            for task in [*self._tasks, *self._opening.values()]:
                task.cancel()
            borrowed, self._borrowed, self._connections = self._borrowed, {}, {}
            self._by_slot.clear()
            for node, connection in borrowed.values():
                await connection.disconnect()
                node.release(connection)
