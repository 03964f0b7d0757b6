"""An idempotent payments API: ``POST /payments`` needs an Idempotency-Key.

Run: ``python3 -m uv run uvicorn examples.payments:app``. Configured from
``HEADWAY_REDIS_URL`` and ``HEADWAY_DATABASE_URL`` (run ``headway migrate`` on it
first); without them it uses the embedded defaults (in-memory lock and rate limits,
SQLite file). Each caller (its bearer token, else its address) may make 100 requests
a minute; a replay is answered before the limiter and costs none of them. A body
that is not JSON (or nests too deeply to parse) is answered 400, one without a
positive integer ``amount`` 422.

Idempotency records are filed per caller by its bearer token (the default scope
function): a retry with the same token is replayed; a request without one runs once
and is never replayed (409 on a retry).

    curl -i -X POST localhost:8000/payments -H 'Idempotency-Key: "order-1"' \\
         -H 'Authorization: Bearer demo' \\
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


def problem(status: int, title: str, detail: str) -> Response:
    """An RFC 9457 problem: a client error is answered, never a 500."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    return JSONResponse(body, status_code=status, media_type="application/problem+json")


async def create_payment(request: Request) -> Response:
    try:
        payload = await request.json()
    except ValueError:
        # Also the UnicodeDecodeError of a body that is not UTF-8, and a number of more
        # than 4300 digits (Python's limit on converting text to int).
        return problem(400, "Malformed JSON", "The body is not a JSON document.")
    except RecursionError:
        # Arrays or objects nested deeper than the parser's recursion limit (about a
        # thousand levels): ``json.loads`` gives up cleanly, with nothing to undo.
        return problem(400, "Malformed JSON", "The body nests arrays or objects too deeply.")
    amount = payload.get("amount") if isinstance(payload, dict) else None
    # bool is an int subclass: ``true`` is not an amount.
    if type(amount) is not int or amount <= 0:
        detail = 'The body must be a JSON object with a positive integer "amount".'
        return problem(422, "Invalid payment", detail)
    # The side effect that must happen once per key: charging the card.
    charge = {"id": f"ch_{uuid.uuid4().hex}", "amount": amount}
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
