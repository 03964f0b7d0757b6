"""The benchmarked idempotent app: one FastAPI ``POST /payments``, bare or behind each middleware.

Every subject wraps the same FastAPI app, so the numbers differ only by the
middleware. The peers run on the storage they ship with for this setup:
asgi-idempotency-header on its Redis backend, fastapi-idempotency on its
``MemoryStore`` (its only other store needs Tortoise ORM; see the README).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from redis import asyncio as aioredis

from headway import RecordStore

#: name -> what it is (the README's table)
SUBJECTS = {
    "bare": "the FastAPI app alone",
    "headway": "IdempotencyMiddleware, RecordStore.from_url on PostgreSQL + RedisLockBackend",
    "asgi-idempotency-header": "IdempotencyHeaderMiddleware + its RedisBackend",
    "fastapi-idempotency": "IdempotencyMiddleware (BaseHTTPMiddleware) + its MemoryStore",
}


class Payment(BaseModel):
    amount: int


async def pay(payment: Payment) -> JSONResponse:
    return JSONResponse({"id": uuid.uuid4().hex, "amount": payment.amount}, status_code=201)


def bare() -> FastAPI:
    app = FastAPI()
    app.post("/payments")(pay)
    return app


def headway(store: RecordStore, redis_client: aioredis.Redis) -> Any:
    from headway import IdempotencyMiddleware, RedisLockBackend

    return IdempotencyMiddleware(bare(), store=store, lock_backend=RedisLockBackend(redis_client))


def asgi_idempotency_header(store: RecordStore, redis_client: aioredis.Redis) -> Any:
    from idempotency_header_middleware import IdempotencyHeaderMiddleware
    from idempotency_header_middleware.backends import RedisBackend

    backend = RedisBackend(redis_client, keys_key="bench:ih-keys", response_key="bench:ih:")
    return IdempotencyHeaderMiddleware(bare(), backend=backend)


def fastapi_idempotency(store: RecordStore, redis_client: aioredis.Redis) -> Any:
    from fastapi_idempotency import IdempotencyMiddleware, MemoryStore

    app = bare()
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore())
    return app


#: name -> builder, given headway's store (the peers ignore it) and a Redis client.
BUILDERS: dict[str, Callable[[RecordStore, aioredis.Redis], Any]] = {
    "bare": lambda store, client: bare(),
    "headway": headway,
    "asgi-idempotency-header": asgi_idempotency_header,
    "fastapi-idempotency": fastapi_idempotency,
}
