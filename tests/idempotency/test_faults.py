"""Outages and lost leases: 503 with Retry-After, and never a partial record."""

import asyncio
import gc
import json
import string
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import asyncio as aioredis
from sqlalchemy.ext.asyncio import create_async_engine

from headway import IdempotencyEvent, MemoryLockBackend, RecordStore, RedisLockBackend
from headway.idempotency.table import metadata, records

from .apps import Bank, make_app
from .proxy import Proxy
from .test_middleware import connect, pay, rows

pytestmark = pytest.mark.anyio


@pytest.mark.redis
async def test_redis_down_fails_closed(store: RecordStore, redis_url: str) -> None:
    bank = Bank()
    seen: list[IdempotencyEvent] = []
    redis = aioredis.Redis.from_url("redis://127.0.0.1:1")
    dead = RedisLockBackend(redis, timeout=0.5)
    app = make_app(bank, store=store, lock_backend=dead, on_event=seen.append)
    async with connect(app) as client:
        response = await pay(client, "k")
    await redis.aclose()
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json()["type"].endswith("/idempotency-redis-unavailable")
    assert bank.charges == []
    assert await rows(store) == []
    # The record claimed alongside the lock was given back: the hook hears of it.
    assert [(e.kind, e.key) for e in seen] == [("released", "k")]
    assert seen[0].fence is not None


@pytest.mark.redis
async def test_redis_down_falls_back_to_the_database(store: RecordStore) -> None:
    bank = Bank()
    redis = aioredis.Redis.from_url("redis://127.0.0.1:1")
    dead = RedisLockBackend(redis, timeout=0.5)
    app = make_app(bank, store=store, lock_backend=dead, database_fallback=True)
    async with connect(app) as client:
        bank.proceed.clear()
        first = asyncio.ensure_future(pay(client, "k"))
        await bank.entered.wait()
        duplicate = await pay(client, "k")  # excluded by the PROCESSING row
        bank.proceed.set()
        done = await first
        replay = await pay(client, "k")
    await redis.aclose()
    assert duplicate.status_code == 409
    assert done.status_code == replay.status_code == 201
    assert replay.headers["idempotent-replayed"] == "true"
    assert len(bank.charges) == 1


@pytest.mark.redis
async def test_lost_lease_cancels_the_handler_and_stores_nothing(
    store: RecordStore, redis_client: aioredis.Redis
) -> None:
    bank = Bank()
    backend = RedisLockBackend(redis_client)
    app = make_app(bank, store=store, lock_backend=backend, lease_ttl=0.3)
    async with connect(app) as client:
        bank.proceed.clear()
        first = asyncio.ensure_future(pay(client, "k"))
        await bank.entered.wait()
        await redis_client.flushdb()  # the lease vanishes: the next renewal is refused
        response = await first
        assert response.status_code == 503
        assert response.json()["type"].endswith("/idempotency-lease-lost")
        assert bank.charges == []  # cancelled before its side effect
        assert await rows(store) == []
        bank.proceed.set()
        retry = await pay(client, "k")
    assert retry.status_code == 201
    assert len(bank.charges) == 1


@pytest.mark.postgres
# Connections cut under asyncpg are garbage-collected with a ResourceWarning; collect them here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("pre_ping", [False, True], ids=["from_url", "pre_ping"])
async def test_database_stopped_mid_traffic(postgres_url: str, pre_ping: bool) -> None:
    parts = urlsplit(postgres_url)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    url = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    # ``RecordStore.from_url``'s engine does not ping on checkout (a round trip per
    # statement) and keeps its connections between statements; connections cut by the
    # outage are replaced after it either way.
    store = (
        RecordStore(create_async_engine(url, pool_pre_ping=True), timeout=2)
        if pre_ping
        else RecordStore.from_url(url, timeout=2)
    )
    engine = store.engine
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(records.delete())
    bank = Bank()
    app = make_app(bank, store=store, lock_backend=MemoryLockBackend())
    try:
        async with connect(app) as client:
            before = [await pay(client, f"up-{i}") for i in range(3)]
            await proxy.stop()
            during = await asyncio.gather(*(pay(client, f"down-{i}") for i in range(5)))
            await proxy.start()
            after = [await pay(client, f"down-{i}") for i in range(5)]
            replays = [await pay(client, f"up-{i}") for i in range(3)]
    finally:
        stored = await rows(RecordStore(engine))
        await store.aclose()
        await proxy.stop()
        gc.collect()
    assert [r.status_code for r in before] == [201] * 3
    assert [r.status_code for r in during] == [503] * 5
    assert all(r.headers["retry-after"] == "1" for r in during)
    assert {r.json()["type"].rsplit("/", 1)[1] for r in during} == {
        "idempotency-database-unavailable"
    }
    assert [r.status_code for r in after] == [201] * 5
    assert all(r.headers["idempotent-replayed"] == "true" for r in replays)
    assert len(bank.charges) == 8  # nothing ran while the database was down
    assert sorted(stored) == sorted(
        [(f"up-{i}", "COMPLETED") for i in range(3)]
        + [(f"down-{i}", "COMPLETED") for i in range(5)]
    )


header_text = st.binary(max_size=300).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
keys = st.one_of(
    header_text,
    st.text(string.printable, max_size=300).map(lambda s: f'"{s}"'.encode("latin-1")),
    st.text('abc-_.:/+=~"\\ ;=?*()', max_size=300).map(str.encode),
)


def test_hypothesis_keys_and_headers_never_500(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'h.sqlite3'}"

    async def setup() -> None:
        engine = create_async_engine(url)
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        await engine.dispose()

    asyncio.run(setup())

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        key_values=st.lists(keys, min_size=0, max_size=3),
        extra=st.lists(
            st.tuples(st.sampled_from([b"authorization", b"content-type", b"x"]), header_text),
            max_size=3,
        ),
        amount=st.integers(),
    )
    def check(key_values: list[bytes], extra: list[tuple[bytes, bytes]], amount: int) -> None:
        body = json.dumps({"amount": amount}).encode()

        async def go() -> int:
            engine = create_async_engine(url)
            bank = Bank()
            app = make_app(bank, store=RecordStore(engine), required=True)
            headers = [(b"idempotency-key", k) for k in key_values] + extra
            try:
                async with connect(app) as client:
                    response = await client.post("/payments", content=body, headers=headers)
                    return response.status_code
            finally:
                await engine.dispose()

        # Well-formed keys run (or replay, or meet a reuse; 409 for a caller left unnamed
        # by a blank Authorization); anything else is a 400.
        assert asyncio.run(go()) in {201, 400, 409, 422}

    check()
