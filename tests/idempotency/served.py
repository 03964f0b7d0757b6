"""The app the multi-process test serves with uvicorn: its side effect is a line in a file."""

from __future__ import annotations

import asyncio
import os
import uuid

from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway import IdempotencyMiddleware, RecordStore, RedisLockBackend

EFFECTS = os.environ["HEADWAY_TEST_EFFECTS"]


async def pay(request: Request) -> Response:
    payload = await request.json()
    with open(EFFECTS + ".entered", "a") as entered:
        entered.write(f"{os.getpid()}\n")
    # Long enough for duplicates to arrive in flight; outside the fingerprint, so a
    # retry can ask for a different pause than the request it retries.
    gate = request.headers.get("x-gate")  # a file the test creates to let this return
    if gate is not None:
        while not os.path.exists(gate):
            await asyncio.sleep(0.02)  # the test process's signal: polled
    else:
        await asyncio.sleep(float(request.headers.get("x-sleep", "0.3")))
    charge = {"id": uuid.uuid4().hex, "pid": os.getpid(), **payload}
    with open(EFFECTS, "a") as effects:
        effects.write(f"{charge['id']}\n")
    return JSONResponse(charge, status_code=201)


app = Starlette(
    routes=[Route("/payments", pay, methods=["POST"])],
    middleware=[
        Middleware(
            IdempotencyMiddleware,
            store=RecordStore.from_url(os.environ["HEADWAY_TEST_DATABASE_URL"]),
            lock_backend=RedisLockBackend(Redis.from_url(os.environ["HEADWAY_TEST_REDIS_URL"])),
            lease_ttl=float(os.environ.get("HEADWAY_TEST_LEASE", "30")),
        )
    ],
)
