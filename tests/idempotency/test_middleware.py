import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from headway import MemoryLockBackend, RecordStore
from headway.idempotency.table import records

from .apps import Bank, make_app

pytestmark = pytest.mark.anyio

A = {"authorization": "Bearer alice"}
B = {"authorization": "Bearer bob"}


@pytest.fixture
def bank() -> Bank:
    return Bank()


@pytest.fixture
async def client(store: RecordStore, bank: Bank) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(bank, store=store, lock_backend=MemoryLockBackend(), max_body=2000)
    async with connect(app) as c:
        yield c


def connect(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(
        transport=transport, base_url="http://test", headers={"authorization": "Bearer tester"}
    )


def pay(client: httpx.AsyncClient, key: str | bytes | None, amount: int = 10) -> Any:
    head = {k.encode(): v.encode() for k, v in A.items()}
    if key is not None:
        head[b"idempotency-key"] = key if isinstance(key, bytes) else key.encode()
    return client.post("/payments", json={"amount": amount}, headers=head)


async def rows(store: RecordStore) -> list[tuple[str, str]]:
    async with store.engine.connect() as conn:
        result = await conn.execute(sa.select(records.c.key, records.c.status))
        return [(k, s) for k, s in result.all()]


async def test_retry_is_replayed_not_executed(
    client: httpx.AsyncClient, bank: Bank, store: RecordStore
) -> None:
    first = await pay(client, '"order-1"')
    again = await pay(client, "order-1")  # bare token: the same key
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() == {"id": 1, "amount": 10}
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.headers["x-charge"] == "1"
    assert again.headers["content-type"] == "application/json"
    assert len(bank.charges) == 1
    assert await rows(store) == [("order-1", "COMPLETED")]


async def test_huge_request_body_is_refused_before_anything_runs(
    store: RecordStore, bank: Bank
) -> None:
    app = make_app(bank, store=store, lock_backend=MemoryLockBackend(), max_request_body=1000)
    async with connect(app) as client:
        head = {**A, "idempotency-key": '"big-1"'}
        big = await client.post("/payments", content=b"x" * 1001, headers=head)
        fits = await pay(client, '"small-1"')
    assert big.status_code == 413
    assert big.headers["content-type"] == "application/problem+json"
    assert big.json()["type"].endswith("/idempotency-request-too-large")
    assert fits.status_code == 201
    assert len(bank.charges) == 1
    assert await rows(store) == [("small-1", "COMPLETED")]


async def test_without_key_requests_pass_through(client: httpx.AsyncClient, bank: Bank) -> None:
    assert (await pay(client, None)).status_code == 201
    assert (await pay(client, None)).status_code == 201
    assert len(bank.charges) == 2


async def test_key_required(store: RecordStore, bank: Bank) -> None:
    async with connect(make_app(bank, store=store, required=True)) as client:
        response = await pay(client, None)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/problem+json"
    # A tag: URI (RFC 4151) under a name no one can register: never a stranger's web page.
    assert response.json()["type"] == "tag:headway.invalid,2026:problems/idempotency-key-missing"
    assert bank.charges == []


@pytest.mark.parametrize("key", ['"unterminated', "has space", "é", '""', "x" * 256, '"a",  "b"'])
async def test_malformed_key_is_400(client: httpx.AsyncClient, bank: Bank, key: str) -> None:
    response = await pay(client, key.encode())
    assert response.status_code == 400
    assert response.json()["type"].endswith("/idempotency-key-malformed")
    assert bank.charges == []


async def test_repeated_header_is_400(client: httpx.AsyncClient, bank: Bank) -> None:
    headers = [("idempotency-key", "a"), ("idempotency-key", "b"), ("authorization", "x")]
    response = await client.post("/payments", json={"amount": 1}, headers=headers)
    assert response.status_code == 400
    assert bank.charges == []


async def test_same_key_different_request_is_422(client: httpx.AsyncClient, bank: Bank) -> None:
    assert (await pay(client, "k", amount=10)).status_code == 201
    response = await pay(client, "k", amount=11)
    assert response.status_code == 422
    assert response.json()["type"].endswith("/idempotency-key-reused")
    other_path = await client.put(
        "/payments", json={"amount": 10}, headers={**A, "idempotency-key": "k"}
    )
    assert other_path.status_code == 201  # PUT is not guarded by default
    assert len(bank.charges) == 2


async def test_concurrent_duplicate_is_409_then_replayed(
    client: httpx.AsyncClient, bank: Bank
) -> None:
    bank.proceed.clear()
    first = asyncio.ensure_future(pay(client, "k"))
    await bank.entered.wait()
    duplicate = await pay(client, "k")
    assert duplicate.status_code == 409
    # When the holder's lease ends at the latest: it was just claimed (and is renewed).
    assert 1 <= int(duplicate.headers["retry-after"]) <= 5
    assert duplicate.json()["type"].endswith("/idempotency-key-in-use")
    bank.proceed.set()
    assert (await first).status_code == 201
    assert (await pay(client, "k")).headers["idempotent-replayed"] == "true"
    assert len(bank.charges) == 1


async def test_waiting_duplicate_gets_the_replay(store: RecordStore, bank: Bank) -> None:
    async with connect(make_app(bank, store=store, wait=5.0)) as client:
        bank.proceed.clear()
        first = asyncio.ensure_future(pay(client, "k"))
        await bank.entered.wait()
        duplicate = asyncio.ensure_future(pay(client, "k"))
        await asyncio.sleep(0.05)  # let the duplicate start waiting (either order is correct)
        bank.proceed.set()
        a, b = await first, await duplicate
    assert a.status_code == b.status_code == 201
    assert a.json() == b.json()
    assert len(bank.charges) == 1


async def test_callers_are_isolated(client: httpx.AsyncClient, bank: Bank) -> None:
    alice = await pay(client, "shared")
    bob = await client.post(
        "/payments", json={"amount": 10}, headers={**B, "idempotency-key": "shared"}
    )
    assert alice.json()["id"] == 1
    assert bob.json()["id"] == 2  # executed for Bob, not Alice's response
    assert "idempotent-replayed" not in bob.headers
    assert len(bank.charges) == 2


async def test_exception_releases_the_record(
    client: httpx.AsyncClient, bank: Bank, store: RecordStore
) -> None:
    headers = {**A, "idempotency-key": "k"}
    for _ in range(2):
        response = await client.post("/boom", content=b"", headers=headers)
        assert response.status_code == 500
    assert len(bank.charges) == 2  # the retry ran again
    assert await rows(store) == []


async def test_server_errors_are_not_stored_by_default(
    client: httpx.AsyncClient, bank: Bank, store: RecordStore
) -> None:
    headers = {**A, "idempotency-key": "k"}
    assert (await client.post("/fail", headers=headers)).status_code == 502
    assert (await client.post("/fail", headers=headers)).status_code == 502
    assert len(bank.charges) == 2
    assert await rows(store) == []


async def test_server_errors_stored_when_configured(store: RecordStore, bank: Bank) -> None:
    async with connect(make_app(bank, store=store, store_server_errors=True)) as client:
        headers = {**A, "idempotency-key": "k"}
        assert (await client.post("/fail", headers=headers)).status_code == 502
        replay = await client.post("/fail", headers=headers)
    assert replay.status_code == 502
    assert replay.headers["idempotent-replayed"] == "true"
    assert len(bank.charges) == 1


async def test_too_large_response_is_streamed_and_never_rerun(
    client: httpx.AsyncClient, bank: Bank, store: RecordStore
) -> None:
    headers = {**A, "idempotency-key": "k"}
    first = await client.post("/big", headers=headers)
    assert first.status_code == 200
    assert first.content == b"x" * 4000  # the client got all of it
    retry = await client.post("/big", headers=headers)
    assert retry.status_code == 410
    assert retry.json()["type"].endswith("/idempotency-response-not-stored")
    assert retry.json()["original_status"] == 200
    assert len(bank.charges) == 1
    assert await rows(store) == [("k", "COMPLETED")]


async def test_get_is_not_guarded(client: httpx.AsyncClient) -> None:
    response = await client.get("/payments", headers={"idempotency-key": "???"})
    assert response.status_code == 405  # straight to the app: no 400 for a bad key
