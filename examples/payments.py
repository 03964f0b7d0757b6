"""An idempotent payments API: ``POST /payments`` needs an Idempotency-Key.

Run: ``python3 -m uv run uvicorn examples.payments:app``. Configured from
``HEADWAY_REDIS_URL`` and ``HEADWAY_DATABASE_URL`` (run ``headway migrate`` on it
first); without them it uses the embedded defaults (in-memory lock, SQLite file).

    curl -i -X POST localhost:8000/payments -H 'Idempotency-Key: "order-1"' \\
         -H 'Content-Type: application/json' -d '{"amount": 1000}'
"""

from __future__ import annotations

import os
import uuid

from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import headway
from headway.idempotency import IdempotencyMiddleware, RecordStore

DATABASE_URL = os.environ.get("HEADWAY_DATABASE_URL", "sqlite+aiosqlite:///headway.sqlite3")


def lock_backend() -> headway.LockBackend:
    url = os.environ.get("HEADWAY_REDIS_URL")
    return headway.RedisLockBackend(Redis.from_url(url)) if url else headway.MemoryLockBackend()


async def create_payment(request: Request) -> Response:
    payload = await request.json()
    # The side effect that must happen once per key: charging the card.
    charge = {"id": f"ch_{uuid.uuid4().hex}", "amount": payload.get("amount")}
    return JSONResponse(charge, status_code=201)


app = Starlette(
    routes=[Route("/payments", create_payment, methods=["POST"])],
    middleware=[
        # Outermost, so replays never reach (and are never charged by) a rate limiter
        # mounted after it.
        Middleware(
            IdempotencyMiddleware,
            store=RecordStore.from_url(DATABASE_URL),
            lock_backend=lock_backend(),
            required=True,
        ),
    ],
)
