"""examples/payments.py on the embedded defaults."""

import importlib
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.anyio


async def test_payments_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADWAY_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'p.sqlite3'}")
    monkeypatch.delenv("HEADWAY_REDIS_URL", raising=False)
    payments = importlib.reload(importlib.import_module("examples.payments"))

    transport = httpx.ASGITransport(app=payments.app)
    async with (
        payments.lifespan(payments.app),
        httpx.AsyncClient(transport=transport, base_url="http://test") as client,
    ):
        alice = {"authorization": "Bearer alice"}
        missing = await client.post("/payments", json={"amount": 5}, headers=alice)
        keyed = {**alice, "idempotency-key": "p1"}
        first = await client.post("/payments", json={"amount": 5}, headers=keyed)
        again = await client.post("/payments", json={"amount": 5}, headers=keyed)
        # Without credentials the caller is unnamed: the key runs once, never replays.
        anonymous = {"idempotency-key": "p2"}
        once = await client.post("/payments", json={"amount": 5}, headers=anonymous)
        retried = await client.post("/payments", json={"amount": 5}, headers=anonymous)
    assert missing.status_code == 400
    assert first.status_code == again.status_code == 201
    assert first.json()["id"].startswith("ch_")
    assert again.json() == first.json()
    assert (once.status_code, retried.status_code) == (201, 409)
    assert retried.json()["type"].endswith("/idempotency-key-unverified")


@pytest.mark.parametrize("redis", [False, True], ids=["embedded", "redis"])
async def test_payments_are_limited_per_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, redis: bool
) -> None:
    monkeypatch.setenv("HEADWAY_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'p.sqlite3'}")
    if redis:
        request.getfixturevalue("sync_redis_client")  # a flushed database
        monkeypatch.setenv("HEADWAY_REDIS_URL", request.getfixturevalue("redis_url"))
    else:
        monkeypatch.delenv("HEADWAY_REDIS_URL", raising=False)
    payments = importlib.reload(importlib.import_module("examples.payments"))

    def as_(token: str, key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {token}", "idempotency-key": key}

    transport = httpx.ASGITransport(app=payments.app)
    async with (
        payments.lifespan(payments.app),
        httpx.AsyncClient(transport=transport, base_url="http://test") as client,
    ):
        alice = [
            await client.post("/payments", json={"amount": 1}, headers=as_("alice", f"a{i}"))
            for i in range(100)
        ]
        # Replays are answered before the limiter: they cost alice nothing.
        replay = await client.post("/payments", json={"amount": 1}, headers=as_("alice", "a0"))
        refused = await client.post("/payments", json={"amount": 1}, headers=as_("alice", "a100"))
        bob = await client.post("/payments", json={"amount": 1}, headers=as_("bob", "b0"))
    assert [r.status_code for r in alice] == [201] * 100
    assert alice[0].headers["ratelimit"].startswith('"per-caller";r=99;')
    assert replay.status_code == 201
    assert replay.headers["idempotent-replayed"] == "true"
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert bob.status_code == 201  # another caller, its own quota
