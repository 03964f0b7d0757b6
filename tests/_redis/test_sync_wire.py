"""headway's sync connections (``SyncWire``), against a real Redis server."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from redis import exceptions as redis_errors

from headway._redis.sync_wire import SyncWire
from tests._redis.test_wire import ECHO, FAIL, INCR
from tests.redis_observed import connections_named

pytestmark = [pytest.mark.redis]


@pytest.fixture
def sync_wire(sync_redis_client: redis.Redis) -> Any:
    wire = SyncWire(sync_redis_client)
    yield wire
    wire.close()


def test_sync_calls_from_many_threads_each_get_their_own_reply(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, client_name="sync-wire")
    wire = SyncWire(client)

    def work(i: int) -> list[Any]:
        return [wire.call(ECHO, [f"k{i}-{j}"], [j]) for j in range(50)]

    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(work, range(16)))
        for i, replies in enumerate(results):
            assert replies == [[f"k{i}-{j}".encode(), str(j).encode()] for j in range(50)]
        # A connection per thread in a call, reused: as many as were ever in a call at
        # once (a bound: how many that was is the threads' timing).
        assert 1 <= len(connections_named(redis_url, "sync-wire")) <= 8
    finally:
        wire.close()
        client.close()


def test_sync_errors_a_flushed_library_and_a_lost_connection(
    sync_wire: SyncWire, sync_redis_client: redis.Redis
) -> None:
    assert sync_wire.call(INCR, ["n"], []) == 1
    sync_redis_client.function_flush()
    assert sync_wire.call(INCR, ["n"], []) == 2  # loaded again on the same call
    with pytest.raises(redis_errors.ResponseError, match="BOOM"):
        sync_wire.call(FAIL, ["k"], [])
    assert sync_wire.call(INCR, ["n"], []) == 3  # the connection went on
    sync_redis_client.client_kill_filter(_type="normal", skipme=True)
    with pytest.raises((redis_errors.ConnectionError, OSError)):
        sync_wire.call(INCR, ["n"], [])  # the killed socket is found closed, and dropped
    assert sync_wire.call(INCR, ["n"], []) == 4  # a new one


def test_sync_disabled_goes_through_redis_py(sync_redis_client: redis.Redis) -> None:
    wire = SyncWire(sync_redis_client, enabled=False)
    assert wire.call(INCR, ["n"], []) == 1
    assert wire.requests == 0
