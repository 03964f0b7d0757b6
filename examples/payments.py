"""An idempotent payments API: ``POST /payments`` needs an Idempotency-Key.

Run: ``python3 -m uv run uvicorn examples.payments:app``. Configured from
``HEADWAY_REDIS_URL`` and ``HEADWAY_DATABASE_URL`` (run ``headway migrate`` on it
first); without them it uses the embedded defaults (in-memory lock and rate limits,
SQLite file). Each caller (its bearer token, else its address) may make 100 requests
a minute; a replay is answered before the limiter and costs none of them.

    curl -i -X POST localhost:8000/payments -H 'Idempotency-Key: "order-1"' \\
         -H 'Content-Type: application/json' -d '{"amount": 1000}'
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import AsyncIterator

from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Scope

import headway
from headway import (
    ClientAddress,
    IdempotencyMiddleware,
    MemoryRateLimitBackend,
    RateLimitBackend,
    RateLimitMiddleware,
    RecordStore,
    RedisRateLimitBackend,
    Rule,
    SlidingLog,
)

DATABASE_URL = os.environ.get("HEADWAY_DATABASE_URL", "sqlite+aiosqlite:///headway.sqlite3")
REDIS_URL = os.environ.get("HEADWAY_REDIS_URL")
REDIS = Redis.from_url(REDIS_URL) if REDIS_URL else None
STORE = RecordStore.from_url(DATABASE_URL)


def lock_backend() -> headway.LockBackend:
    return headway.RedisLockBackend(REDIS) if REDIS else headway.MemoryLockBackend()


def rate_limit_backend() -> RateLimitBackend:
    return RedisRateLimitBackend(REDIS) if REDIS else MemoryRateLimitBackend()


_address = ClientAddress()


def caller(scope: Scope) -> str | None:
    """The bearer token (hashed: keys never hold secrets), else the client address."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return "bearer@" + hashlib.blake2b(value[7:].strip(), digest_size=16).hexdigest()
    return _address(scope)


async def create_payment(request: Request) -> Response:
    payload = await request.json()
    # The side effect that must happen once per key: charging the card.
    charge = {"id": f"ch_{uuid.uuid4().hex}", "amount": payload.get("amount")}
    return JSONResponse(charge, status_code=201)


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    yield
    await STORE.aclose()
    if REDIS is not None:
        await REDIS.aclose()


app = Starlette(
    lifespan=lifespan,
    routes=[Route("/payments", create_payment, methods=["POST"])],
    middleware=[
        # Outermost, so replays never reach (and are never charged by) a rate limiter
        # mounted after it.
        Middleware(
            IdempotencyMiddleware,
            store=STORE,
            lock_backend=lock_backend(),
            required=True,
        ),
        Middleware(
            RateLimitMiddleware,
            rules=[Rule(SlidingLog(100, 60), name="per-caller", identity=caller)],
            backend=rate_limit_backend(),
        ),
    ],
)
