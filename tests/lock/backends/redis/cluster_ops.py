"""Topology changes on a throw-away Redis Cluster (blocking: run them in a thread).

A slot is moved the way ``redis-cli --cluster reshard`` moves it; a primary is
killed by PID and its replica promoted by the Cluster itself.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from tests.servers import RedisServers, Server


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, decode_responses=True)


def _call(port: int, *command: Any) -> Any:
    client = _client(port)
    try:
        return client.execute_command(*command)  # type: ignore[no-untyped-call]
    finally:
        client.close()


def slot_of(port: int, key: str) -> int:
    """The hash slot of ``key``."""
    return int(_call(port, "CLUSTER", "KEYSLOT", key))


def owner(port: int, slot: int) -> int:
    """The port of the primary that serves ``slot`` (as the node on ``port`` sees it)."""
    for start, end, primary, *_ in _call(port, "CLUSTER", "SLOTS"):
        if int(start) <= slot <= int(end):
            return int(primary[1])
    raise LookupError(f"slot {slot} is not served")


def _state(port: int) -> str:
    client = _client(port)
    try:
        return str(client.cluster("info").get("cluster_state"))
    finally:
        client.close()


def node_id(port: int) -> str:
    return str(_call(port, "CLUSTER", "MYID"))


def migrate_slot(slot: int, source: int, target: int, everyone: list[int]) -> int:
    """Move ``slot`` from the primary on ``source`` to the one on ``target`` while
    clients use it: IMPORTING / MIGRATING, MIGRATE of its keys until none is left,
    then SETSLOT NODE everywhere. Returns how many keys were moved."""
    target_id, source_id = node_id(target), node_id(source)
    _call(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    _call(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    moved = 0
    while keys := _call(source, "CLUSTER", "GETKEYSINSLOT", slot, 100):
        _call(source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        moved += len(keys)
    for port in (target, source, *(p for p in everyone if p not in (source, target))):
        _call(port, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    return moved


def kill_primary_and_await_promotion(
    servers: RedisServers, nodes: list[Server], slot: int, timeout: float = 30.0
) -> tuple[int, int]:
    """SIGKILL the primary serving ``slot``; wait until a replica serves it and every
    live node sees the Cluster whole. Returns (old port, new port)."""
    ports = [node.port for node in nodes]
    old = owner(ports[0], slot)
    servers.stop(next(node for node in nodes if node.port == old))
    alive = [port for port in ports if port != old]
    deadline = time.monotonic() + timeout
    while True:
        try:
            new = owner(alive[0], slot)
            whole = all(_state(p) == "ok" and owner(p, slot) == new for p in alive)
            if new != old and whole:
                return old, new
        except (redis.ConnectionError, LookupError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("no replica was promoted")
        time.sleep(0.05)
