import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from headway import (
    BackendUnavailable,
    Claim,
    ClaimOutcome,
    RecordStatus,
    RecordStore,
    StoredResponse,
)
from headway.idempotency.table import db_now, records

from .statements import Statements

pytestmark = pytest.mark.anyio

RESPONSE = StoredResponse(201, (("content-type", "application/json"),), b'{"id": 1}')


async def claim(
    store: RecordStore, fence: int | None, fingerprint: str = "f" * 64, key: str = "k"
) -> Claim:
    return await store.claim(
        "caller", key, fingerprint, fence=fence, lease_token=f"t{fence}", lease_ttl=30
    )


async def end_lease(store: RecordStore) -> None:
    """As if the worker holding the record stopped renewing it (died, or was paused)."""
    async with store.engine.begin() as conn:
        await conn.execute(records.update().values(lease_expires_at=db_now(-1)))


async def test_claim_complete_get(store: RecordStore) -> None:
    assert await store.get("caller", "k") is None
    assert (await claim(store, 5)).outcome is ClaimOutcome.CLAIMED
    record = await store.get("caller", "k")
    assert record is not None
    assert (record.status, record.fence, record.response) == (RecordStatus.PROCESSING, 5, None)
    assert await store.complete("caller", "k", 5, RESPONSE)
    record = await store.get("caller", "k")
    assert record is not None
    assert (record.status, record.response) == (RecordStatus.COMPLETED, RESPONSE)


async def test_keys_compare_byte_for_byte(store: RecordStore) -> None:
    """Case, trailing spaces and accents make other keys, on every database (MySQL's text
    collations would merge them: the key column is VARBINARY there)."""
    keys = ["Order-1", "order-1", "order-1 ", "order-1  ", "ordér-1", "orde\u0301r-1"]
    for n, key in enumerate(keys):
        assert (await claim(store, n + 1, key=key)).outcome is ClaimOutcome.CLAIMED, key
        assert await store.complete("caller", key, n + 1, RESPONSE)
    for n, key in enumerate(keys):
        record = await store.get("caller", key)
        assert record is not None
        assert record.fence == n + 1, key
    assert await store.purge() == 0  # keys read back by purge's batch select still match


async def test_get_is_one_statement_autocommitted_on_postgresql(store: RecordStore) -> None:
    """A replay's read costs one round trip on PostgreSQL: no BEGIN, no COMMIT."""
    await claim(store, 5)
    sent = Statements(store.engine)
    assert await store.get("caller", "k") is not None
    assert (await sent.settled()).sent == ["SELECT"]
    if store.engine.dialect.name == "postgresql":
        assert sent.autocommitted == [True]
        assert sent.transactions == 0


async def test_completed_record_is_returned_not_taken_over(store: RecordStore) -> None:
    await claim(store, 5)
    assert await store.complete("caller", "k", 5, RESPONSE)
    again = await claim(store, 9)
    assert again.outcome is ClaimOutcome.COMPLETED
    assert again.record is not None
    assert again.record.response == RESPONSE
    assert (await claim(store, 9, fingerprint="0" * 64)).outcome is ClaimOutcome.MISMATCH


async def test_stale_fence_cannot_complete_after_takeover(store: RecordStore) -> None:
    await claim(store, 5)
    assert (await claim(store, 7)).outcome is ClaimOutcome.BUSY  # its lease is still renewed
    assert await store.renew("caller", "k", 5, 30)
    await end_lease(store)
    assert (await claim(store, 4)).outcome is ClaimOutcome.BUSY  # older token: no takeover
    assert (await claim(store, 7)).outcome is ClaimOutcome.CLAIMED  # newer lease takes over
    assert not await store.renew("caller", "k", 5, 30)
    assert not await store.complete("caller", "k", 5, RESPONSE)  # the paused worker
    assert not await store.release("caller", "k", 5)
    record = await store.get("caller", "k")
    assert record is not None
    assert (record.status, record.fence, record.response) == (RecordStatus.PROCESSING, 7, None)
    assert await store.complete("caller", "k", 7, RESPONSE)
    assert not await store.complete("caller", "k", 7, RESPONSE)  # only once


async def test_release_deletes_only_own_processing_record(store: RecordStore) -> None:
    await claim(store, 5)
    assert not await store.release("caller", "k", 6)
    assert await store.release("caller", "k", 5)
    assert await store.get("caller", "k") is None
    await claim(store, 8)
    await store.complete("caller", "k", 8, RESPONSE)
    assert not await store.release("caller", "k", 8)  # completed records stay


async def test_too_large_response_is_completed_without_body(store: RecordStore) -> None:
    await claim(store, 1)
    assert await store.complete("caller", "k", 1, StoredResponse(200, (), None))
    record = await store.get("caller", "k")
    assert record is not None
    assert record.response == StoredResponse(200, (), None)


async def test_concurrent_claims_exactly_one_wins(store: RecordStore) -> None:
    outcomes = await asyncio.gather(*(claim(store, 100) for _ in range(10)))
    assert sorted(o.outcome.value for o in outcomes) == ["busy"] * 9 + ["claimed"]


async def test_expiry_and_purge_use_the_database_clock(store: RecordStore) -> None:
    for i in range(7):
        await claim(store, 1, key=f"old{i}")
    await claim(store, 1, key="live")
    async with store.engine.begin() as conn:
        await conn.execute(
            records.update().where(records.c.key.like("old%")).values(expires_at=db_now(-1))
        )
    assert await store.get("caller", "old0") is None  # expired: never replayed
    assert (await claim(store, 1, key="old1")).outcome is ClaimOutcome.CLAIMED  # replaced
    assert await store.purge(batch_size=2) == 6
    async with store.engine.connect() as conn:
        keys = (await conn.execute(sa.select(records.c.key).order_by(records.c.key))).scalars()
        assert list(keys) == ["live", "old1"]


async def test_database_down_raises_backend_unavailable() -> None:
    engine = create_async_engine("postgresql+asyncpg://postgres@127.0.0.1:1/nothing")
    store = RecordStore(engine, timeout=2)
    with pytest.raises(BackendUnavailable) as caught:
        await store.get("caller", "k")
    assert caught.value.backend == "database"
    await engine.dispose()


async def test_database_only_claims_pick_their_own_tokens(store: RecordStore) -> None:
    first = await claim(store, None)
    assert first.outcome is ClaimOutcome.CLAIMED
    assert first.fence is not None
    assert 0 < first.fence <= 1 << 40
    assert (await claim(store, None)).outcome is ClaimOutcome.BUSY  # the primary key excludes
    await end_lease(store)
    second = await claim(store, None)
    assert (second.outcome, second.fence) == (ClaimOutcome.CLAIMED, first.fence + 1)
    assert not await store.complete("caller", "k", first.fence, RESPONSE)
    await end_lease(store)
    locked = await claim(store, 10**15)  # a lock holder takes over a lapsed database lease
    assert (locked.outcome, locked.fence) == (ClaimOutcome.CLAIMED, 10**15)
