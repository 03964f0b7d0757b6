"""The examples run as documented (on the embedded defaults and on Redis)."""

import asyncio
import os
import runpy
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from headway.idempotency.table import metadata

EXAMPLES = Path(__file__).parent.parent / "examples"


def run(script: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_standalone_lock_in_memory() -> None:
    out = run("standalone_lock.py", HEADWAY_REDIS_URL="")
    assert "balance 500 after 50 deposits" in out


@pytest.mark.redis
def test_standalone_lock_on_redis(redis_url: str) -> None:
    out = run("standalone_lock.py", HEADWAY_REDIS_URL=redis_url)
    assert "balance 500 after 50 deposits" in out


async def create_table(url: str) -> None:
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    await engine.dispose()


def test_webhook_consumer_on_the_embedded_defaults() -> None:
    out = run("webhook_consumer.py", HEADWAY_DATABASE_URL="", HEADWAY_REDIS_URL="")
    assert "12 deliveries of 4 events: 4 orders shipped" in out
    assert out.count("warehouse unavailable") == 1
    assert out.count("every delivery answered ['shp_") == 4  # one answer per event


@pytest.mark.postgres
@pytest.mark.redis
def test_webhook_consumer_on_postgresql_and_redis(postgres_url: str, redis_url: str) -> None:
    asyncio.run(create_table(postgres_url))  # what `headway migrate` does in production
    out = run("webhook_consumer.py", HEADWAY_DATABASE_URL=postgres_url, HEADWAY_REDIS_URL=redis_url)
    assert "12 deliveries of 4 events: 4 orders shipped" in out
    assert out.count("every delivery answered ['shp_") == 4


@pytest.fixture
async def payments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    """The payments example on the embedded defaults, with its SQLite file in ``tmp_path``."""
    monkeypatch.setenv("HEADWAY_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'h.sqlite3'}")
    monkeypatch.setenv("HEADWAY_REDIS_URL", "")
    example = runpy.run_path(str(EXAMPLES / "payments.py"))
    transport = httpx.ASGITransport(app=example["app"], raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client
    await example["STORE"].aclose()


def pay(client: httpx.AsyncClient, body: bytes, key: str) -> Any:
    headers = {"idempotency-key": f'"{key}"', "content-type": "application/json"}
    return client.post("/payments", content=body, headers=headers)


@pytest.mark.anyio
async def test_payments_charges_a_valid_body(payments: httpx.AsyncClient) -> None:
    response = await pay(payments, b'{"amount": 1000}', "ok")
    assert response.status_code == 201
    assert response.json()["amount"] == 1000


@pytest.mark.anyio
@pytest.mark.parametrize("body", [b"", b"{", b"not json", b'{"amount": 1', b"\xff"])
async def test_payments_answers_400_to_malformed_json(
    payments: httpx.AsyncClient, body: bytes
) -> None:
    response = await pay(payments, body, "malformed")
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["status"] == 400


@pytest.mark.anyio
@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b"42",
        b"null",
        b'"amount"',
        b"{}",
        b'{"amount": "1000"}',
        b'{"amount": 10.5}',
        b'{"amount": true}',
        b'{"amount": 0}',
        b'{"amount": -5}',
        b'{"amount": null}',
    ],
)
async def test_payments_answers_422_to_a_body_without_a_positive_amount(
    payments: httpx.AsyncClient, body: bytes
) -> None:
    response = await pay(payments, body, "invalid")
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["status"] == 422
