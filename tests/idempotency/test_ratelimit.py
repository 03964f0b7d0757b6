"""Both middlewares mounted: a replay costs no rate-limit quota when idempotency is outside.

docs/idempotency.md says to mount ``IdempotencyMiddleware`` outside (before)
``RateLimitMiddleware``: a replay is then answered before the limiter sees it. The opposite
order charges replays, which is why the guide recommends the first one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_sfv.list import List as SfvList
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway import (
    FixedWindow,
    IdempotencyMiddleware,
    MemoryLockBackend,
    MemoryRateLimitBackend,
    RateLimitMiddleware,
    RecordStore,
    Rule,
)
from headway._clock import FakeClock

pytestmark = pytest.mark.anyio

QUOTA = 2
WINDOW = 3600.0


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[RecordStore]:
    store = RecordStore.from_url(f"sqlite+aiosqlite:///{tmp_path / 'headway.sqlite3'}")
    try:
        yield store
    finally:
        await store.aclose()


def app(
    store: RecordStore,
    charges: list[int],
    *,
    idempotency_outside: bool,
    clock: FakeClock | None = None,
) -> Starlette:
    async def pay(request: Request) -> Response:
        charges.append(len(charges) + 1)
        return JSONResponse({"id": charges[-1]}, status_code=201)

    idempotency = Middleware(IdempotencyMiddleware, store=store, lock_backend=MemoryLockBackend())
    limit = Middleware(
        RateLimitMiddleware,
        rules=[Rule(FixedWindow(limit=QUOTA, window=WINDOW), name="api")],
        backend=MemoryRateLimitBackend(clock=clock or FakeClock()),
    )
    # Starlette runs the first middleware of the list outermost.
    middleware = [idempotency, limit] if idempotency_outside else [limit, idempotency]
    return Starlette(routes=[Route("/payments", pay, methods=["POST"])], middleware=middleware)


def connect(asgi: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=asgi, client=("192.0.2.1", 40000))
    return httpx.AsyncClient(
        transport=transport, base_url="http://test", headers={"authorization": "Bearer tester"}
    )


async def pay(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.post("/payments", json={"amount": 1}, headers={"idempotency-key": key})


def remaining(response: httpx.Response) -> int:
    """The quota left after this request, from its ``RateLimit`` header."""
    parsed = SfvList()
    parsed.parse(response.headers["ratelimit"].encode("ascii"))
    (item,) = parsed
    assert item.value == "api"
    return int(item.params["r"])


async def test_replays_cost_no_quota_with_idempotency_outside(store: RecordStore) -> None:
    charges: list[int] = []
    clock = FakeClock()
    async with connect(app(store, charges, idempotency_outside=True, clock=clock)) as client:
        first = await pay(client, '"order-1"')
        replays = [await pay(client, '"order-1"') for _ in range(5)]
        second = await pay(client, '"order-2"')
        over = await pay(client, '"order-3"')
        over_again = await pay(client, '"order-3"')
        clock.advance(WINDOW)
        later = await pay(client, '"order-3"')
    assert first.status_code == 201
    assert remaining(first) == QUOTA - 1
    for replay in replays:
        assert replay.status_code == 201
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.json() == first.json()
        assert "ratelimit" not in replay.headers  # the limiter never saw it
    # Five replays later the quota still has room for exactly one new request.
    assert second.status_code == 201
    assert remaining(second) == 0
    assert over.status_code == 429
    # The refusal was not stored: the retry meets the limiter again, rather than a replay
    # of the 429 (without its Retry-After) for the record's whole TTL.
    assert over_again.status_code == 429
    assert "idempotent-replayed" not in over_again.headers
    # The clock stands still at the window's start: the whole window is left to wait.
    assert over_again.headers["retry-after"] == str(int(WINDOW))
    assert later.status_code == 201  # a new window: the refused request runs at last
    assert "idempotent-replayed" not in later.headers
    assert charges == [1, 2, 3]


async def test_replays_are_charged_with_the_limiter_outside(store: RecordStore) -> None:
    """The order the guide warns against: the limiter counts replays like new requests."""
    charges: list[int] = []
    async with connect(app(store, charges, idempotency_outside=False)) as client:
        first = await pay(client, '"order-1"')
        replay = await pay(client, '"order-1"')
        refused = await pay(client, '"order-1"')
        new = await pay(client, '"order-2"')
    assert remaining(first) == QUOTA - 1
    assert replay.status_code == 201
    assert replay.headers["idempotent-replayed"] == "true"
    assert remaining(replay) == 0  # the replay took the last unit
    assert refused.status_code == 429  # a retry of a done request, refused
    assert new.status_code == 429  # and no quota is left for new work
    assert charges == [1]
