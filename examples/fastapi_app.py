"""A FastAPI reports API, rate-limited per tier with ``RateLimitDependency``.

Run: ``python3 -m uv run uvicorn examples.fastapi_app:app``. Limits live in
Redis when ``HEADWAY_REDIS_URL`` is set, else in this process's memory.

Callers send ``Authorization: Bearer <token>``; ``TOKENS`` stands for your
user table (or the claims of a verified JWT). Each user's tier picks the
policies (``free``, ``pro``, ``enterprise``), named in the RateLimit headers;
anonymous callers are limited by address at the free tier. ``POST /exports``
has a stricter quota of its own, and its refusal tells free users where to
upgrade (an ``on_refusal`` hook adding a member to the problem body). Both
refusals are documented in ``/docs`` (OpenAPI). Invalid input gets a 422 problem
naming each invalid field (``invalid_request``: never the value sent, which FastAPI's
own handler echoes, and fails to render for some inputs).

    curl -i localhost:8000/reports/1 -H 'Authorization: Bearer pro-token'
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from redis.asyncio import Redis
from starlette.responses import Response
from starlette.types import Scope

from headway import (
    ClientAddress,
    FixedWindow,
    MemoryRateLimitBackend,
    Policy,
    RateLimitBackend,
    RateLimitDependency,
    RateLimitRefused,
    RedisRateLimitBackend,
    RefusalContext,
    SlidingCounter,
    TokenBucket,
)

REDIS_URL = os.environ.get("HEADWAY_REDIS_URL")
REDIS = Redis.from_url(REDIS_URL) if REDIS_URL else None
BACKEND: RateLimitBackend = RedisRateLimitBackend(REDIS) if REDIS else MemoryRateLimitBackend()

#: token -> (user id, tier). A real app verifies the token and reads its user's plan.
TOKENS = {
    "free-token": ("ann", "free"),
    "pro-token": ("bob", "pro"),
    "enterprise-token": ("eve", "enterprise"),
}

#: The policies of each tier, by the name the RateLimit headers give them.
TIERS: dict[str, dict[str, Policy]] = {
    "free": {"free": FixedWindow(limit=5, window=60.0)},
    "pro": {"pro": SlidingCounter(limit=100, window=60.0)},
    "enterprise": {
        "enterprise-burst": TokenBucket(capacity=50, rate=20),
        "enterprise": SlidingCounter(limit=5000, window=60.0),
    },
}

_address = ClientAddress()


def _bearer(scope: Scope) -> tuple[str, str] | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization" and value.startswith(b"Bearer "):
            return TOKENS.get(value[7:].decode("latin-1").strip())
    return None


def caller(scope: Scope) -> str | None:
    """Whose quota a request charges: the user, else the client's address."""
    user = _bearer(scope)
    return f"user:{user[0]}" if user else _address(scope)


def tier_policies(scope: Scope) -> dict[str, Policy]:
    """The policies of the caller's tier (called on every request; cheap)."""
    user = _bearer(scope)
    return TIERS[user[1] if user else "free"]


def upgrade_hint(context: RefusalContext) -> dict[str, Any] | None:
    """Free callers refused by a quota are told where to get more."""
    if context.status == 429 and tier_policies(context.scope) is TIERS["free"]:
        return {"upgrade": "https://example.com/pricing"}
    return None


reads = RateLimitDependency(
    tier_policies, name="reads", identity=caller, backend=BACKEND, on_refusal=upgrade_hint
)
exports = RateLimitDependency(
    FixedWindow(limit=2, window=60.0),
    name="exports",
    identity=caller,
    per="rule",
    backend=BACKEND,
    on_refusal=upgrade_hint,
)


app = FastAPI(title="headway reports example")
app.add_exception_handler(RateLimitRefused, RateLimitRefused.handler)


@app.exception_handler(RequestValidationError)
async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
    """422 as an RFC 9457 problem: where each error is and why, never the value sent.

    FastAPI's default handler echoes each error's ``input`` and answers 500 when it
    cannot render one: a NaN or 1e999 number, bytes that are not UTF-8, a lone surrogate.
    """
    errors = [
        {"loc": [str(part) for part in error["loc"]], "msg": error["msg"], "type": error["type"]}
        for error in exc.errors()
    ]
    problem = {
        "type": "about:blank",
        "title": "Invalid request",
        "status": 422,
        "detail": "The request does not match what this endpoint takes: see errors.",
        "errors": errors,
    }
    # json.dumps escapes non-ASCII, so even a lone surrogate in a name cannot break it.
    body = json.dumps(problem, ensure_ascii=True).encode()
    return Response(body, status_code=422, media_type="application/problem+json")


#: ``invalid_request``'s answer in OpenAPI, instead of FastAPI's default 422 schema.
INVALID: dict[int | str, dict[str, Any]] = {
    422: {"description": "Invalid request", "content": {"application/problem+json": {}}}
}


class ExportRequest(BaseModel):
    report_id: int = Field(gt=0)
    format: Literal["csv", "json"] = "csv"


@app.get("/health")
async def health() -> dict[str, bool]:
    return {"ok": True}


@app.get(
    "/reports/{report_id}", dependencies=[Depends(reads)], responses={**reads.responses, **INVALID}
)
async def report(report_id: int) -> dict[str, Any]:
    return {"id": report_id, "rows": 42}


@app.post(
    "/exports",
    status_code=202,
    dependencies=[Depends(reads), Depends(exports)],
    responses={**reads.responses, **exports.responses, **INVALID},
)
async def export(request: ExportRequest) -> dict[str, Any]:
    return {"report": request.report_id, "format": request.format, "status": "queued"}
