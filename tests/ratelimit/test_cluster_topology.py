"""The limiter on a Redis Cluster whose topology changes under traffic (headway's connections).

Each test starts its own throw-away Cluster and stops it by PID. A slot migrated while
decisions run (``CLUSTER SETSLOT`` + ``MIGRATE``): ASK and then MOVED are followed, no
decision fails, the limit is admitted exactly; a node sent a call by ASK that has never
loaded the script's library loads it first. A primary killed while decisions run:
calls fail with ``BackendUnavailable`` only, decisions resume on the promoted replica,
and what is admitted past the limit is at most what the dead primary had admitted and
not yet replicated (counted from the replica's own copy of the counter).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from redis import asyncio as aioredis
from redis.cluster import RedisCluster

from headway import (
    BackendUnavailable,
    FixedWindow,
    RedisRateLimitBackend,
    SyncRedisRateLimitBackend,
)
from headway._redis.cluster_wire import slot_of
from headway.ratelimit.backends.redis_scripts import state_keys
from headway.ratelimit.decision import Decision
from tests.redis_observed import commands_run, errors_replied
from tests.servers import RedisServers, Server

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.slow]

LIMIT = 300
POLICIES = [FixedWindow(LIMIT, 86_400, on_error="deny")]  # a day: no boundary mid-test
KEY = "hot"
KEYS = state_keys(KEY, POLICIES)
SLOT = slot_of(KEYS)
WAIT = 30.0  # seconds: a bound for a hung test, not a measurement


class Tally:
    """Decisions counted exactly across tasks or threads; waits for a number of them."""

    def __init__(self) -> None:
        self.decided = self.allowed = self.refused = self.failed = 0
        self._changed = threading.Condition()

    def record(self, decision: Decision | None) -> None:
        with self._changed:
            if decision is None:
                self.failed += 1
            else:
                self.decided += 1
                self.allowed += decision.allowed
                self.refused += not decision.allowed
            self._changed.notify_all()

    def wait(self, done: Callable[[Tally], bool]) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: done(self), WAIT), "decisions stopped"


def node_id(port: int) -> str:
    with redis.Redis(port=port) as client:
        return str(client.execute_command("CLUSTER", "MYID"), "ascii")


def owner(ports: list[int], slot: int) -> int:
    """The port of the primary serving ``slot``, as a live node sees it."""
    with redis.Redis(port=ports[0]) as client:
        for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
    raise AssertionError(f"slot {slot} is not served")


class Migration:
    """The steps of moving one slot from ``source`` to ``target`` (``redis-cli --cluster
    reshard`` does the same)."""

    def __init__(self, source: int, target: int, primaries: list[int]) -> None:
        self.source, self.target, self.primaries = source, target, primaries

    def begin(self) -> None:
        with redis.Redis(port=self.target) as target, redis.Redis(port=self.source) as source:
            target.execute_command("CLUSTER", "SETSLOT", SLOT, "IMPORTING", node_id(self.source))
            source.execute_command("CLUSTER", "SETSLOT", SLOT, "MIGRATING", node_id(self.target))

    def move_keys(self) -> None:
        with redis.Redis(port=self.source) as source:
            while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", SLOT, 100):
                source.execute_command(
                    "MIGRATE", "127.0.0.1", self.target, "", 0, 5000, "KEYS", *keys
                )

    def end(self) -> None:
        target_id = node_id(self.target)
        for port in [self.target, self.source, *self.primaries]:
            with redis.Redis(port=port) as client:
                client.execute_command("CLUSTER", "SETSLOT", SLOT, "NODE", target_id)


@pytest.fixture
def cluster(redis_servers: RedisServers) -> Iterator[list[Server]]:
    nodes = redis_servers.cluster(3)
    try:
        yield nodes
    finally:
        for node in nodes:
            redis_servers.stop(node)


def migration_of(cluster: list[Server]) -> Migration:
    ports = [node.port for node in cluster]
    source = owner(ports, SLOT)
    target = next(port for port in ports if port != source)
    return Migration(source, target, ports)


def run_migration(tally: Tally, migration: Migration) -> None:
    """Each step once decisions have run through the previous one (50 more each time)."""
    for step in (migration.begin, migration.move_keys, migration.end, None):
        mark = tally.decided
        tally.wait(lambda t, mark=mark: t.decided >= mark + 50)  # type: ignore[misc]
        if step is not None:
            step()
    tally.wait(lambda t: t.refused >= 20)  # past the limit, on the target


def check_redirected(tally: Tally, cluster: list[Server], migration: Migration) -> None:
    """Each decision ran once, wherever it was sent; the source redirected calls both ways.

    How many calls the source answered ASK (keys moved, slot still migrating) and MOVED
    (the migration ended: the first calls after, on the old map) depends on how many
    were in flight at each step, so those are bounds; at least one of each is certain,
    as decisions run through every step.
    """
    ran = commands_run(*(node.url for node in cluster))
    assert (ran["fcall"], ran["evalsha"]) == (tally.decided, 0)
    replied = errors_replied(f"redis://127.0.0.1:{migration.source}/0")
    assert replied["ASK"] >= 1
    assert replied["MOVED"] >= 1


async def test_a_slot_migrated_under_traffic_admits_exactly_the_limit(
    cluster: list[Server],
) -> None:
    migration = migration_of(cluster)
    client = aioredis.RedisCluster(host="127.0.0.1", port=cluster[0].port)
    backend = RedisRateLimitBackend(client)
    tally, stop = Tally(), asyncio.Event()

    async def traffic() -> None:
        while not stop.is_set():
            tally.record(await backend.decide(KEY, POLICIES, 1, False))  # any error: a failure

    try:
        tasks = [asyncio.create_task(traffic()) for _ in range(16)]
        try:
            await asyncio.to_thread(run_migration, tally, migration)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        assert (tally.failed, tally.allowed) == (0, LIMIT)
        check_redirected(tally, cluster, migration)
        with redis.Redis(port=migration.target) as target:
            assert target.exists(*KEYS) == len(KEYS)
    finally:
        await backend.aclose()
        await client.aclose()


async def test_a_slot_migrated_under_sync_traffic_admits_exactly_the_limit(
    cluster: list[Server],
) -> None:
    migration = migration_of(cluster)
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    backend = SyncRedisRateLimitBackend(client)
    tally, stop = Tally(), threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            tally.record(backend.decide(KEY, POLICIES, 1, False))

    threads = [threading.Thread(target=traffic) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        try:
            run_migration(tally, migration)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        assert (tally.failed, tally.allowed) == (0, LIMIT)
        check_redirected(tally, cluster, migration)
    finally:
        backend.close()
        client.close()


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_a_node_asked_to_run_a_call_it_has_no_library_for_loads_it_first(
    cluster: list[Server], mode: str
) -> None:
    # The keys moved, the slot still migrating: the owner answers ASK, and the importing
    # node, which has never run the script, answers "Function not found" to ASKING +
    # FCALL. The call goes again as FUNCTION LOAD, ASKING, FCALL in that order (ASKING
    # covers the one command after it).
    migration = migration_of(cluster)
    with redis.Redis(port=migration.target) as target:
        target.function_flush()
    if mode == "async":
        client: object = aioredis.RedisCluster(host="127.0.0.1", port=cluster[0].port)
        backend: object = RedisRateLimitBackend(client)
    else:
        client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
        backend = SyncRedisRateLimitBackend(client)

    async def decide() -> Decision:
        reply = backend.decide(KEY, POLICIES, 1, False)  # type: ignore[attr-defined]
        return await reply if mode == "async" else reply  # type: ignore[no-any-return]

    try:
        assert (await decide()).remaining == LIMIT - 1  # on the source: its library loaded
        migration.begin()
        migration.move_keys()
        target = f"redis://127.0.0.1:{migration.target}/0"
        before = commands_run(target)
        decision = await decide()
        ran = commands_run(target) - before
        assert (decision.allowed, decision.remaining) == (True, LIMIT - 2)
        assert (ran["function|load"], ran["asking"], ran["fcall"]) == (1, 2, 1)
        with redis.Redis(port=migration.target) as target:
            assert target.function_list()  # the library stayed
    finally:
        if mode == "async":
            await backend.aclose()  # type: ignore[attr-defined]
            await client.aclose()  # type: ignore[attr-defined]
        else:
            backend.close()  # type: ignore[attr-defined]
            client.close()  # type: ignore[attr-defined]


def replica_count(port: int) -> int:
    """The units the replica on ``port`` holds for ``KEY`` (0 if it has none)."""
    with redis.Redis(port=port) as replica:
        pipe = replica.pipeline(transaction=False)
        pipe.execute_command("READONLY")  # a replica serves reads on this connection
        pipe.get(KEYS[0])
        state = pipe.execute()[1]
    return 0 if state is None else int(re.findall(rb"\d+", state)[-1])


class Shard:
    """A Cluster of 3 primaries with a replica each (1 s node timeout), seen from ``SLOT``."""

    def __init__(self, servers: RedisServers) -> None:
        self.servers = servers
        self.nodes = servers.cluster(3, replicas=1, node_timeout_ms=1000)
        self.by_port = {node.port: node for node in self.nodes}
        self.primary = owner(list(self.by_port), SLOT)
        with redis.Redis(port=self.primary) as client:
            self.replica = int(client.info("replication")["slave0"]["port"])
        # Clients start from a node of another shard, as after a restart of the app.
        self.start = next(p for p in self.by_port if p not in (self.primary, self.replica))

    def kill(self) -> int:
        """SIGKILL the slot's primary; the units its replica holds (frozen until promoted)."""
        self.servers.stop(self.by_port[self.primary])
        return replica_count(self.replica)

    def wait_promoted(self) -> None:
        deadline = time.monotonic() + WAIT
        with redis.Redis(port=self.replica) as copy:
            while copy.info("replication")["role"] != "master":
                assert time.monotonic() < deadline, "the replica was not promoted"
                time.sleep(0.02)  # polling the Cluster's state, not our own tasks


@pytest.fixture
def shard(redis_servers: RedisServers) -> Iterator[Shard]:
    shard = Shard(redis_servers)
    try:
        yield shard
    finally:
        for node in shard.nodes:
            redis_servers.stop(node)


def check_failover(tally: Tally, kept: int, admitted_by_the_dead: int, failed: int) -> None:
    """What a failover may cost: failures while the shard is down, and admissions past
    the limit no more than the dead primary had admitted and its replica not received."""
    assert failed > 0  # the shard was down for a while, and said so
    lost = admitted_by_the_dead - kept
    assert tally.allowed - LIMIT <= max(lost, 0)


async def test_a_primary_killed_under_traffic_loses_at_most_what_it_had_not_replicated(
    shard: Shard,
) -> None:
    client = aioredis.RedisCluster(
        host="127.0.0.1", port=shard.start, socket_timeout=2, socket_connect_timeout=2
    )
    backend = RedisRateLimitBackend(client)
    tally, stop = Tally(), asyncio.Event()

    async def traffic() -> None:
        while not stop.is_set():
            try:
                tally.record(await backend.decide(KEY, POLICIES, 1, False))
            except BackendUnavailable:  # the one failure callers may see
                tally.record(None)
                await asyncio.sleep(0.005)  # pacing while the shard is down

    tasks = [asyncio.create_task(traffic()) for _ in range(16)]
    try:
        await asyncio.to_thread(tally.wait, lambda t: t.allowed >= 100)
        kept = shard.kill()  # under traffic
        await asyncio.to_thread(shard.wait_promoted)
        admitted_by_the_dead = tally.allowed  # a superset: its replies all came before
        failed = tally.failed
        await asyncio.to_thread(tally.wait, lambda t: t.refused >= 20)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    check_failover(tally, kept, admitted_by_the_dead, failed)
    peek = await backend.decide(KEY, POLICIES, 1, True)
    assert peek.remaining == 0  # the promoted replica counts up to the limit
    await backend.aclose()
    await client.aclose()


async def test_a_primary_killed_under_sync_traffic_loses_at_most_what_it_had_not_replicated(
    shard: Shard,
) -> None:
    client = RedisCluster(
        host="127.0.0.1", port=shard.start, socket_timeout=2, socket_connect_timeout=2
    )
    backend = SyncRedisRateLimitBackend(client)
    tally, stop = Tally(), threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            try:
                tally.record(backend.decide(KEY, POLICIES, 1, False))
            except BackendUnavailable:
                tally.record(None)
                stop.wait(0.005)  # pacing while the shard is down

    threads = [threading.Thread(target=traffic) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        try:
            tally.wait(lambda t: t.allowed >= 100)
            kept = shard.kill()
            shard.wait_promoted()
            admitted_by_the_dead, failed = tally.allowed, tally.failed
            tally.wait(lambda t: t.refused >= 20)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        check_failover(tally, kept, admitted_by_the_dead, failed)
        assert backend.decide(KEY, POLICIES, 1, True).remaining == 0
    finally:
        backend.close()
        client.close()
