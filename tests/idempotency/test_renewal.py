"""A record taken over by another worker: the first handler is cancelled, its write refused."""

import asyncio
import dataclasses

import httpx
import pytest
import sqlalchemy as sa
from redis import asyncio as aioredis

from headway import Lease, LockLost, MemoryLockBackend, RecordStore, RedisLockBackend
from headway.idempotency.claim import claim_record
from headway.idempotency.record import ClaimOutcome
from headway.idempotency.table import db_now, records

from .apps import Bank, make_app
from .test_middleware import connect, pay

pytestmark = pytest.mark.anyio


async def take_over(store: RecordStore) -> int:
    """Another worker takes the record over, as once the first one's lease ran out: its fence.

    One transaction ends the lease and claims, so the first worker's renewal cannot
    slip in between: it waits for the row and then finds it is no longer its own.
    """
    async with store.engine.begin() as conn:
        query = sa.select(records.c.scope, records.c.key, records.c.fingerprint)
        scope, key, fingerprint = (await conn.execute(query)).one()
        await conn.execute(records.update().values(lease_expires_at=db_now(-1)))
        claim = await claim_record(
            conn, scope, key, fingerprint, fence=None, lease_token="peer", lease_ttl=30, ttl=60
        )
    assert claim.outcome is ClaimOutcome.CLAIMED
    assert claim.fence is not None
    return claim.fence


async def record(store: RecordStore) -> tuple[str, int]:
    async with store.engine.connect() as conn:
        status, fence = (await conn.execute(sa.select(records.c.status, records.c.fence))).one()
        return status, fence


async def test_taken_over_record_cancels_the_handler(store: RecordStore) -> None:
    bank = Bank()
    app = make_app(bank, store=store, lock_backend=MemoryLockBackend(), lease_ttl=0.3)
    async with connect(app) as client:
        bank.proceed.clear()
        first = asyncio.ensure_future(pay(client, "k"))
        await bank.entered.wait()
        fence = await take_over(store)
        response = await first  # its next renewal (every 0.1 s) is refused
        bank.proceed.set()
    assert response.status_code == 503
    assert response.json()["type"].endswith("/idempotency-lease-lost")
    assert bank.charges == []  # cancelled before its side effect
    assert await record(store) == ("PROCESSING", fence)  # the new worker's record, untouched


async def test_taken_over_record_refuses_the_late_completion(store: RecordStore) -> None:
    bank = Bank()
    app = make_app(bank, store=store, lock_backend=MemoryLockBackend(), lease_ttl=30)
    transport = httpx.ASGITransport(app=app)  # the app's error reaches the test
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        bank.proceed.clear()
        first = asyncio.ensure_future(pay(client, "k"))
        await bank.entered.wait()
        fence = await take_over(store)  # before its first renewal (at 10 s) could notice
        bank.proceed.set()
        with pytest.raises(LockLost, match="superseded"):
            await first  # the response started, and is cut instead of finished
    assert len(bank.charges) == 1
    assert await record(store) == ("PROCESSING", fence)  # nothing stored over it


@pytest.mark.redis
async def test_without_the_lock_the_record_lease_alone_is_renewed(store: RecordStore) -> None:
    bank = Bank()
    redis = aioredis.Redis.from_url("redis://127.0.0.1:1")  # the lock backend is down
    dead = RedisLockBackend(redis, timeout=0.5)
    app = make_app(bank, store=store, lock_backend=dead, lease_ttl=0.9, database_fallback=True)
    async with asyncio.timeout(10), connect(app) as client:
        bank.proceed.clear()
        first = asyncio.ensure_future(pay(client, "k"))
        await bank.entered.wait()
        await asyncio.sleep(2.0)  # over two lease TTLs: only renewals keep the record ours
        duplicate = await pay(client, "k")
        bank.proceed.set()
        done = await first
    await redis.aclose()
    assert duplicate.status_code == 409  # the record's lease was still live
    assert done.status_code == 201
    assert len(bank.charges) == 1


class LapsedOnArrival(MemoryLockBackend):
    """Its grants arrive nearly spent and already lapsed: as a lock handed over after a
    long wait whose holder was then paused past its TTL."""

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        lease = await super().acquire(resource, ttl, timeout)
        await self.release(lease)  # the store let it go meanwhile
        return dataclasses.replace(lease, deadline=lease.deadline - 0.95 * ttl)


async def test_a_lease_lapsed_before_the_work_starts_gives_the_record_back(
    store: RecordStore,
) -> None:
    bank = Bank()
    app = make_app(bank, store=store, lock_backend=LapsedOnArrival(), lease_ttl=30)
    async with connect(app) as client:
        lost = await pay(client, "k")  # the watchdog's first renewal is refused
        assert lost.status_code == 503
        assert lost.json()["type"].endswith("/idempotency-lease-lost")
        assert bank.charges == []  # the work never ran
        # The record was given back, not left in flight for the lease's 30 s: a retry
        # claims it again (409 otherwise), and, its lock lapsed on arrival too, ends alike.
        retried = await pay(client, "k")
    assert retried.status_code == 503
    assert await record_count(store) == 0


async def record_count(store: RecordStore) -> int:
    async with store.engine.connect() as conn:
        return int(
            (await conn.execute(sa.select(sa.func.count()).select_from(records))).scalar_one()
        )
