"""Script calls from sync code on a Redis Cluster: a ``SyncWire`` per node, calls routed by slot.

The sync twin of ``_redis.cluster_wire`` (read its docstring for what MOVED, ASK and
TRYAGAIN mean and why resending is safe): each call goes to its slot's primary, per
the slot map of the client (redis-py's ``nodes_manager``), over that node's
``SyncWire`` (sockets headway drives, one thread's call at a time). A node that
cannot be reached fails the call (outcome unknown) and refreshes the map, so the
next call finds a promoted replica.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.cluster import PRIMARY, ClusterNode

from headway._redis.cluster_wire import MAX_REDIRECTS, slot_of
from headway._redis.errors import UNAVAILABLE
from headway._redis.resp import Arg, Packed, unpacked
from headway._redis.scripts import Script
from headway._redis.sync_wire import SyncWire

__all__ = ["SyncClusterWire"]

log = logging.getLogger("headway")

_TRY_AGAIN_PAUSE = 0.02  # seconds (see ``_redis.cluster_wire``)
_REFRESH_PAUSE = 0.05


class SyncClusterWire:
    """Script calls on a ``redis.cluster.RedisCluster``: one ``SyncWire`` per primary.

    ``enabled=False`` sends every call through the Cluster client (redis-py).
    """

    def __init__(self, client: Any, enabled: bool = True) -> None:
        self.client = client
        self.enabled = enabled
        self._wires: dict[str, SyncWire] = {}  # by node name
        self._creating = threading.Lock()
        self._refreshing = threading.Lock()
        self._refreshed = float("-inf")

    def call(self, script: Script, keys: Sequence[str], args: Sequence[Arg] | Packed) -> Any:
        """Run ``script`` on its slot's primary and return its reply (errors are raised)."""
        if not self.enabled:
            return script.run_sync(self.client, keys, unpacked(args))
        slot = slot_of(keys)
        node, asking = self._primary(slot), False
        for _ in range(MAX_REDIRECTS + 1):
            try:
                return self._wire(node).call(script, keys, args, asking)
            except redis_errors.MovedError as error:
                self.client.nodes_manager.move_slot(error)
                node, asking = self._primary(slot), False
            except redis_errors.AskError as error:
                node, asking = self._node(error.host, error.port), True
            except redis_errors.TryAgainError:  # the migration of these keys is under way
                time.sleep(_TRY_AGAIN_PAUSE)
                node, asking = self._primary(slot), False
            except UNAVAILABLE:  # the node may be gone: ask the Cluster who serves its slots
                self._refresh()
                raise
        raise redis_errors.ClusterError(f"still redirected after {MAX_REDIRECTS}")

    def _primary(self, slot: int) -> Any:
        try:
            return self.client.nodes_manager.get_node_from_slot(slot)
        except redis_errors.SlotNotCoveredError as exc:
            self._refresh()
            raise redis_errors.ClusterError(str(exc)) from exc

    def _node(self, host: str, port: int) -> Any:
        manager = self.client.nodes_manager
        node = manager.get_node(host=host, port=port)
        if node is None:  # not in the map yet (an ASK to a new node): as redis-py adds one
            node = ClusterNode(host, port, PRIMARY)  # type: ignore[no-untyped-call]
            manager.create_redis_connections([node])
            manager.nodes_cache[node.name] = node
        return node

    def _wire(self, node: Any) -> SyncWire:
        wire = self._wires.get(node.name)
        if wire is not None and wire.client is node.redis_connection:
            return wire
        with self._creating:  # one SyncWire per node, whatever threads ask at once
            wire = self._wires.get(node.name)
            if wire is None or wire.client is not node.redis_connection:
                if node.redis_connection is None:
                    self.client.nodes_manager.create_redis_connections([node])
                stale, wire = wire, SyncWire(node.redis_connection)
                self._wires[node.name] = wire
                if stale is not None:
                    stale.close()
            return wire

    def _refresh(self) -> None:
        if time.monotonic() - self._refreshed < _REFRESH_PAUSE:
            return
        if not self._refreshing.acquire(blocking=False):
            return  # another thread refreshes it
        try:
            self.client.nodes_manager.initialize()
        except Exception as exc:  # no node answered: the next failure asks again
            log.debug("refreshing the Cluster slot map failed: %s", exc)
        finally:
            self._refreshed = time.monotonic()
            self._refreshing.release()

    def close(self) -> None:
        """Close headway's idle sockets on every node."""
        for wire in list(self._wires.values()):
            wire.close()
