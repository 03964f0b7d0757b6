"""The record store's contract (``RecordBackend``), through its five calls alone, and both
faces on top of it: over the toy store (a dict) and ``RecordStore`` on every database.

``test_store.py`` covers what only SQL shows (statements sent, byte-for-byte keys, purge,
a lock holder's fence); here a lease runs out in real time, as any store's would.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from headway import (
    Claim,
    ClaimOutcome,
    MemoryLockBackend,
    RecordBackend,
    RecordStatus,
    StoredResponse,
    idempotent_function,
)

from .apps import Bank, make_app
from .toy_store import ToyRecordStore

pytestmark = pytest.mark.anyio

RESPONSE = StoredResponse(201, (("content-type", "application/json"),), b'{"id": 1}')
FINGERPRINT = "f" * 64


async def claim(
    store: RecordBackend, fingerprint: str = FINGERPRINT, *, lease_ttl: float = 30
) -> Claim:
    return await store.claim("caller", "k", fingerprint, lease_token="t", lease_ttl=lease_ttl)


async def test_claim_complete_then_replay(record_backend: RecordBackend) -> None:
    assert await record_backend.get("caller", "k") is None
    claimed = await claim(record_backend)
    assert claimed.outcome is ClaimOutcome.CLAIMED
    assert claimed.fence is not None
    record = await record_backend.get("caller", "k")
    assert record is not None
    assert (record.fingerprint, record.status) == (FINGERPRINT, RecordStatus.PROCESSING)
    assert (record.fence, record.response) == (claimed.fence, None)
    assert await record_backend.complete("caller", "k", claimed.fence, RESPONSE)
    again = await claim(record_backend)
    assert again.outcome is ClaimOutcome.COMPLETED
    assert again.record is not None
    assert (again.record.status, again.record.response) == (RecordStatus.COMPLETED, RESPONSE)
    other = await claim(record_backend, "0" * 64)
    assert other.outcome is ClaimOutcome.MISMATCH
    assert other.record is not None
    assert other.record.fingerprint == FINGERPRINT
    assert not await record_backend.complete("caller", "k", claimed.fence, RESPONSE)  # once


async def test_a_response_is_kept_without_its_body(record_backend: RecordBackend) -> None:
    fence = (await claim(record_backend)).fence
    assert fence is not None
    assert await record_backend.complete("caller", "k", fence, StoredResponse(200, (), None))
    record = await record_backend.get("caller", "k")
    assert record is not None
    assert record.response == StoredResponse(200, (), None)


async def test_a_live_lease_is_busy_and_says_when_it_ends(record_backend: RecordBackend) -> None:
    await claim(record_backend)
    busy = await claim(record_backend)
    assert busy.outcome is ClaimOutcome.BUSY
    assert busy.record is not None
    assert busy.record.status is RecordStatus.PROCESSING
    assert busy.lease_left is None or 0 < busy.lease_left <= 30


async def test_concurrent_claims_exactly_one_wins(record_backend: RecordBackend) -> None:
    outcomes = await asyncio.gather(*(claim(record_backend) for _ in range(10)))
    assert sorted(o.outcome.value for o in outcomes) == ["busy"] * 9 + ["claimed"]


async def test_a_lapsed_lease_is_taken_over_and_the_old_fence_refused(
    record_backend: RecordBackend,
) -> None:
    old = (await claim(record_backend, lease_ttl=0.2)).fence
    assert old is not None
    await asyncio.sleep(0.4)  # the worker stopped renewing (died, or was paused)
    taken = await claim(record_backend)
    assert (taken.outcome, taken.fence) == (ClaimOutcome.CLAIMED, old + 1)
    # The paused worker wakes up: none of its writes lands on the new worker's record.
    assert not await record_backend.renew("caller", "k", old, 30)
    assert not await record_backend.complete("caller", "k", old, RESPONSE)
    assert not await record_backend.release("caller", "k", old)
    record = await record_backend.get("caller", "k")
    assert record is not None
    assert (record.status, record.fence) == (RecordStatus.PROCESSING, old + 1)
    assert await record_backend.complete("caller", "k", old + 1, RESPONSE)


async def test_renewal_keeps_the_record(record_backend: RecordBackend) -> None:
    fence = (await claim(record_backend, lease_ttl=0.2)).fence
    assert fence is not None
    assert await record_backend.renew("caller", "k", fence, 30)
    await asyncio.sleep(0.4)
    assert (await claim(record_backend)).outcome is ClaimOutcome.BUSY
    assert not await record_backend.renew("caller", "k", fence + 1, 30)


async def test_release_deletes_only_our_processing_record(record_backend: RecordBackend) -> None:
    first = (await claim(record_backend)).fence
    assert first is not None
    assert not await record_backend.release("caller", "k", first + 1)
    assert await record_backend.release("caller", "k", first)
    assert await record_backend.get("caller", "k") is None
    second = (await claim(record_backend)).fence
    assert second is not None
    # A fresh record's fence is not one an earlier claim of the key may hold (a counter
    # that restarted would hand the released worker's fence out again).
    assert second != first
    assert not await record_backend.complete("caller", "k", first, RESPONSE)
    assert await record_backend.complete("caller", "k", second, RESPONSE)
    assert not await record_backend.release("caller", "k", second)  # completed records stay


# Both faces over the store alone.


async def test_the_middleware_replays_a_retry(record_backend: RecordBackend) -> None:
    bank = Bank()
    app = make_app(bank, store=record_backend, lock_backend=MemoryLockBackend())
    transport = httpx.ASGITransport(app=app)
    headers = {"authorization": "Bearer alice", "idempotency-key": "order-1"}
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        first = await client.post("/payments", json={"amount": 10}, headers=headers)
        again = await client.post("/payments", json={"amount": 10}, headers=headers)
        other = await client.post("/payments", json={"amount": 11}, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert other.status_code == 422
    assert len(bank.charges) == 1


async def test_a_function_runs_once_per_key_and_again_after_an_error(
    record_backend: RecordBackend,
) -> None:
    runs: list[int] = []

    @idempotent_function(store=record_backend, lock_backend=MemoryLockBackend())
    async def charge(amount: int) -> dict[str, int]:
        runs.append(amount)
        if amount < 0:
            raise ValueError("refund")
        return {"charged": amount}

    assert await charge(5) == await charge(5) == {"charged": 5}
    for _ in range(2):
        with pytest.raises(ValueError, match="refund"):
            await charge(-1)
    assert runs == [5, -1, -1]  # the error released the key: the retry ran


async def test_a_functions_ttl_needs_a_record_store() -> None:
    # How long records are kept is the store's own setting: a store of your own sets it.
    with pytest.raises(TypeError, match="RecordStore"):
        idempotent_function(store=ToyRecordStore(), ttl=5)
