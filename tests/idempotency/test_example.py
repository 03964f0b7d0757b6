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
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        missing = await client.post("/payments", json={"amount": 5})
        first = await client.post(
            "/payments", json={"amount": 5}, headers={"idempotency-key": "p1"}
        )
        again = await client.post(
            "/payments", json={"amount": 5}, headers={"idempotency-key": "p1"}
        )
    assert missing.status_code == 400
    assert first.status_code == again.status_code == 201
    assert first.json()["id"].startswith("ch_")
    assert again.json() == first.json()
