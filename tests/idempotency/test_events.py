"""The ``on_event`` hook, ``Retry-After`` from the holder's lease, and forgetting a record."""

import asyncio
import logging

import httpx
import pytest

from headway import IdempotencyEvent, MemoryLockBackend, RecordStore
from headway.idempotency.callers import caller_id
from headway.idempotency.record import ClaimOutcome, ForgetOutcome, StoredResponse
from headway.idempotency.request import digest
from tests.idempotency.apps import Bank, make_app

pytestmark = pytest.mark.anyio

CALLER = {"authorization": "Bearer a"}


def client_for(bank: Bank, store: RecordStore, **options: object) -> httpx.AsyncClient:
    app = make_app(bank, store=store, lock_backend=MemoryLockBackend(), **options)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(
        transport=transport, base_url="http://test", headers={"authorization": "Bearer tester"}
    )


async def post(client: httpx.AsyncClient, path: str, key: str, amount: int = 1) -> httpx.Response:
    headers = {**CALLER, "idempotency-key": f'"{key}"'}
    return await client.post(path, json={"amount": amount}, headers=headers)


async def test_every_outcome_reaches_the_hook(store: RecordStore) -> None:
    seen: list[IdempotencyEvent] = []

    async def hook(event: IdempotencyEvent) -> None:  # async hooks are awaited
        seen.append(event)

    bank = Bank()
    async with client_for(bank, store, on_event=hook) as client:
        await post(client, "/payments", "k")
        await post(client, "/payments", "k")
        await post(client, "/payments", "k", amount=2)
        await post(client, "/boom", "b")
        bank.entered.clear()
        bank.proceed.clear()
        first = asyncio.ensure_future(post(client, "/payments", "held"))
        await bank.entered.wait()
        await post(client, "/payments", "held")
        bank.proceed.set()
        await first
    kinds = [(e.kind, e.key) for e in seen]
    assert kinds == [
        ("claimed", "k"), ("completed", "k"), ("replayed", "k"), ("key_reused", "k"),
        ("claimed", "b"), ("released", "b"),
        ("claimed", "held"), ("conflict", "held"), ("completed", "held"),
    ]  # fmt: skip
    assert {e.source for e in seen} == {"http"}
    assert len({e.caller for e in seen}) == 1
    # The caller's id (a hash of the scope function's name for it), never the credentials.
    assert seen[0].caller == caller_id("auth:" + digest(b"Bearer a"))
    assert seen[0].scope == seen[0].caller  # the older name, for hooks that read it
    claimed, completed = seen[0], seen[1]
    assert claimed.fence is not None
    assert claimed.fence == completed.fence


async def test_a_failing_hook_is_logged_and_changes_nothing(
    store: RecordStore, caplog: pytest.LogCaptureFixture
) -> None:
    def hook(event: IdempotencyEvent) -> None:
        raise RuntimeError("metrics are down")

    bank = Bank()
    with caplog.at_level(logging.ERROR, logger="headway.idempotency"):
        async with client_for(bank, store, on_event=hook) as client:
            first = await post(client, "/payments", "k")
            again = await post(client, "/payments", "k")
    assert first.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert len(bank.charges) == 1
    assert sum("on_event hook failed" in r.getMessage() for r in caplog.records) == 3


async def test_a_busy_claim_says_when_the_holders_lease_ends(store: RecordStore) -> None:
    caller = caller_id("Bearer a")
    claim = await store.claim(caller, "k", "f" * 64, fence=None, lease_token="t", lease_ttl=30)
    assert claim.outcome is ClaimOutcome.CLAIMED
    busy = await store.claim(caller, "k", "f" * 64, fence=None, lease_token="u", lease_ttl=30)
    assert busy.outcome is ClaimOutcome.BUSY
    assert busy.lease_left is not None
    assert 28 < busy.lease_left <= 30


async def test_retry_after_counts_down_the_lease(store: RecordStore) -> None:
    bank = Bank()
    async with client_for(bank, store, lease_ttl=30) as client:
        bank.proceed.clear()
        first = asyncio.ensure_future(post(client, "/payments", "k"))
        await bank.entered.wait()
        duplicate = await post(client, "/payments", "k")
        bank.proceed.set()
        await first
    assert duplicate.status_code == 409
    assert 28 <= int(duplicate.headers["retry-after"]) <= 30


async def test_forget_keeps_in_flight_records_unless_forced(store: RecordStore) -> None:
    async def claim(key: str) -> ClaimOutcome:
        c = await store.claim("s", key, "f" * 64, fence=None, lease_token="t", lease_ttl=30)
        return c.outcome

    assert await store.forget("s", "absent") is ForgetOutcome.NOT_FOUND
    assert await claim("k") is ClaimOutcome.CLAIMED
    assert await store.forget("s", "k") is ForgetOutcome.IN_FLIGHT  # a retry would run beside it
    assert await claim("k") is ClaimOutcome.BUSY
    assert await store.forget("s", "k", force=True) is ForgetOutcome.REMOVED
    assert await claim("k") is ClaimOutcome.CLAIMED
    record = await store.get("s", "k")
    assert record is not None
    assert await store.complete("s", "k", record.fence, StoredResponse(201, (), b"{}"))
    assert await claim("k") is ClaimOutcome.COMPLETED
    assert await store.forget("s", "k") is ForgetOutcome.REMOVED
    assert await claim("k") is ClaimOutcome.CLAIMED  # the customer's retry runs again
    assert await store.forget("other", "k", force=True) is ForgetOutcome.NOT_FOUND  # scoped
    assert [bool(o) for o in ForgetOutcome] == [True, False, False]  # as the bool it was
