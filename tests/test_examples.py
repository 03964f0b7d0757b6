"""The examples run as documented (on the embedded defaults and on Redis)."""

import asyncio
import math
import os
import re
import runpy
import subprocess
import sys
import time
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


def test_nightly_job_in_memory() -> None:
    out = run("nightly_job.py", HEADWAY_REDIS_URL="")
    assert "3 reports in 3 nights" in out
    assert out.count("skipped, another instance has it") == 6


@pytest.mark.redis
def test_nightly_job_on_redis(redis_url: str) -> None:
    out = run("nightly_job.py", HEADWAY_REDIS_URL=redis_url)
    assert "3 reports in 3 nights" in out
    assert out.count("skipped, another instance has it") == 6


WEBSOCKET_CHAT = [
    "polite client: 5 messages received by the app",
    "flooding client: 15 received, then closed with 1008 (rate limited)",
]


def test_websocket_chat_in_memory() -> None:
    # In memory only: tests/ratelimit/http/test_websocket.py runs the middleware on Redis,
    # and a second run of this script would add ~2 s of imports and test nothing more.
    assert run("websocket_chat.py", HEADWAY_REDIS_URL="").splitlines() == WEBSOCKET_CHAT


#: What leader_worker.py prints, term numbers aside (they differ by backend).
LEADERS = [
    "replica-0: leads, term N",
    "replica-0: resigns (SIGTERM)",
    "replica-1: leads, term N",
    "replica-1: steps down",
    "replica-2: leads, term N",
    "replica-2: steps down",
    "7 batches in 3 terms",
]


def test_leader_worker_in_memory() -> None:
    out = run("leader_worker.py", HEADWAY_REDIS_URL="")
    assert re.sub(r"term \d+", "term N", out).splitlines() == LEADERS


@pytest.mark.redis
def test_leader_worker_on_redis(redis_url: str) -> None:
    out = run("leader_worker.py", HEADWAY_REDIS_URL=redis_url)
    assert re.sub(r"term \d+", "term N", out).splitlines() == LEADERS


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


@pytest.fixture(params=["memory", "redis"])
async def reports(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    """The FastAPI example, its limits in memory or on the test Redis (flushed)."""
    url = "" if request.param == "memory" else request.getfixturevalue("redis_url")
    monkeypatch.setenv("HEADWAY_REDIS_URL", url)
    example = runpy.run_path(str(EXAMPLES / "fastapi_app.py"))
    if example["REDIS"] is not None:
        await example["REDIS"].flushdb()
    transport = httpx.ASGITransport(app=example["app"], client=("192.0.2.7", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client
    if example["REDIS"] is not None:
        await example["REDIS"].aclose()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.mark.anyio
async def test_fastapi_example_limits_each_tier_and_names_it(reports: httpx.AsyncClient) -> None:
    free = [await reports.get("/reports/1", headers=bearer("free-token")) for _ in range(6)]
    assert [r.status_code for r in free] == [200] * 5 + [429]
    assert free[0].headers["ratelimit-policy"] == '"free";q=5;w=60'
    refusal = free[-1]
    assert refusal.headers["content-type"] == "application/problem+json"
    assert refusal.json()["upgrade"] == "https://example.com/pricing"
    assert refusal.json()["violated-policies"] == ["free"]
    pro = [await reports.get("/reports/1", headers=bearer("pro-token")) for _ in range(6)]
    assert [r.status_code for r in pro] == [200] * 6
    assert pro[0].headers["ratelimit-policy"] == '"pro";q=100;w=60'
    big = await reports.get("/reports/1", headers=bearer("enterprise-token"))
    assert big.headers["ratelimit"].startswith('"enterprise-burst";r=49;')
    # Anonymous callers: the free tier, by address (already used by nobody else here).
    anonymous = [await reports.get("/reports/2") for _ in range(6)]
    assert [r.status_code for r in anonymous] == [200] * 5 + [429]
    assert "ratelimit" not in (await reports.get("/health")).headers


@pytest.mark.anyio
async def test_fastapi_example_exports_have_a_quota_of_their_own(
    reports: httpx.AsyncClient,
) -> None:
    body = {"report_id": 1, "format": "json"}
    sent = [
        await reports.post("/exports", json=body, headers=bearer("pro-token")) for _ in range(3)
    ]
    assert [r.status_code for r in sent] == [202, 202, 429]
    assert sent[-1].json()["violated-policies"] == ["exports"]
    assert "upgrade" not in sent[-1].json()  # a pro user is not told to upgrade
    invalid = await reports.post("/exports", json={"report_id": "x"}, headers=bearer("free-token"))
    assert invalid.status_code == 422
    assert invalid.json()["errors"][0]["loc"] == ["body", "report_id"]
    assert "input" not in invalid.json()["errors"][0]  # never echoed


@pytest.mark.anyio
async def test_fastapi_example_documents_its_refusals(reports: httpx.AsyncClient) -> None:
    paths = (await reports.get("/openapi.json")).json()["paths"]
    for path, method in [("/reports/{report_id}", "get"), ("/exports", "post")]:
        responses = paths[path][method]["responses"]
        assert "application/problem+json" in responses["429"]["content"]
        assert "503" in responses  # a policies function may fail closed
        assert "application/problem+json" in responses["422"]["content"]  # invalid_request


@pytest.fixture(params=["memory", "redis"])
def llm_example(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The LLM example's module, its limits in memory or on the test Redis (flushed)."""
    url = "" if request.param == "memory" else request.getfixturevalue("redis_url")
    if url:
        request.getfixturevalue("sync_redis_client")  # flushes the database
    monkeypatch.setenv("HEADWAY_REDIS_URL", url)
    # In process (as the payments and FastAPI examples): a new interpreter takes seconds
    # to import FastAPI and redis-py on a loaded machine.
    return runpy.run_path(str(EXAMPLES / "llm_endpoint.py"))


@pytest.mark.anyio
async def test_llm_endpoint_demo(
    llm_example: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    await llm_example["demo"]()
    out = capsys.readouterr().out
    assert "requests answered: 6, refused: 2" in out
    assert "refused by: ['tokens']" in out
    assert "small answers: 20 of 21" in out


@pytest.mark.anyio
async def test_llm_endpoint_settles_the_tokens_streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADWAY_REDIS_URL", "")
    example = runpy.run_path(str(EXAMPLES / "llm_endpoint.py"))
    transport = httpx.ASGITransport(app=example["app"])
    ask: dict[str, str | int] = {"prompt": "word " * 10, "max_tokens": 100}  # 30 tokens
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        started = time.monotonic()
        first = await client.get("/v1/completions", params=ask, headers={"x-api-key": "k"})
        second = await client.get("/v1/completions", params=ask, headers={"x-api-key": "k"})
        elapsed = time.monotonic() - started
    assert first.text.count("tok") == 30
    # Sent before the stream: 100 reserved of 2,000. The next one sees 30 settled, then
    # its own 100 reserved, and the refill since (2,000 a minute: a loaded machine may
    # take a while between the two; 100 settled unspent would leave 70 fewer).
    assert '"tokens";r=1900;' in first.headers["ratelimit"]
    left = int(second.headers["ratelimit"].split('"tokens";r=')[1].split(";")[0])
    assert 1870 <= left <= 1870 + math.ceil(elapsed * 2000 / 60)
