"""An LLM-style completion endpoint limited in requests per minute *and* tokens per minute.

Run: ``python3 -m uv run uvicorn examples.llm_endpoint:app``. Limits live in Redis when
``HEADWAY_REDIS_URL`` is set, else in this process's memory.

Callers send ``X-API-Key``. Each key may make 20 requests a minute (``requests``) and
use 2,000 tokens a minute (``tokens``, a token bucket). A token count is only known once
the answer has streamed, so the middleware *reserves* the request's ``max_tokens`` when
it arrives (the ``tokens`` policy is charged the estimate, ``requests`` 1) and *settles*
the tokens the handler reported to the request's ``Meter`` when the stream ends: unused
tokens go back; a caller who leaves mid-stream pays for what was sent. The ``RateLimit``
header leaves before the stream, so it shows the quota after the estimate.

    curl -N 'localhost:8000/v1/completions?prompt=hello+there&max_tokens=50' \\
        -H 'X-API-Key: demo'
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from redis.asyncio import Redis
from starlette.responses import StreamingResponse
from starlette.types import Scope

from headway import (
    ApiKey,
    FixedWindow,
    MemoryRateLimitBackend,
    Meter,
    Metering,
    RateLimitBackend,
    RateLimitMiddleware,
    RedisRateLimitBackend,
    Rule,
    TokenBucket,
)

REDIS_URL = os.environ.get("HEADWAY_REDIS_URL")
REDIS = Redis.from_url(REDIS_URL) if REDIS_URL else None
BACKEND: RateLimitBackend = RedisRateLimitBackend(REDIS) if REDIS else MemoryRateLimitBackend()

#: The most tokens one answer may use (and what a request without ``max_tokens`` reserves).
MAX_TOKENS = 500


def max_tokens(scope: Scope) -> int:
    """The request's estimate: its ``max_tokens`` (the most it can use), at most MAX_TOKENS."""
    asked = parse_qs(scope["query_string"].decode()).get("max_tokens", [str(MAX_TOKENS)])
    try:
        return max(1, min(int(asked[0]), MAX_TOKENS))
    except ValueError:
        return MAX_TOKENS


LIMITS = Rule(
    {
        "requests": FixedWindow(20, 60),
        "tokens": TokenBucket(capacity=2_000, rate=2_000, period=60),
    },
    routes=["/v1/completions"],
    identity=ApiKey(),
    name="llm",
    metering=Metering(estimate=max_tokens, policies=["tokens"]),
)

app = FastAPI()
app.add_middleware(RateLimitMiddleware, rules=[LIMITS], backend=BACKEND)


async def fake_model(prompt: str, limit: int) -> AsyncIterator[str]:
    """Stands for the model: three tokens per word of the prompt, at most ``limit``."""
    for i in range(min(3 * len(prompt.split()), limit)):
        await asyncio.sleep(0)
        yield f"tok{i} "


@app.get("/v1/completions")
async def completions(
    request: Request, prompt: str, max_tokens: int = MAX_TOKENS
) -> StreamingResponse:
    """Stream the answer, reporting each token to the request's meter as it is sent."""
    meter = Meter.of(request)

    async def stream() -> AsyncIterator[bytes]:
        async for token in fake_model(prompt, min(max_tokens, MAX_TOKENS)):
            meter.add(1)  # what the settle charges, even if the client leaves now
            yield token.encode()

    return StreamingResponse(stream(), media_type="text/plain")


async def demo() -> None:
    """Three callers' worth of requests, printed: what a run of this file shows."""
    import httpx

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://demo") as client:
        ask: dict[str, str | int] = {"prompt": "word " * 100, "max_tokens": 400}  # 300 tokens each
        codes = []
        for _ in range(8):
            response = await client.get("/v1/completions", params=ask, headers={"x-api-key": "a"})
            codes.append(response.status_code)
        # 2,000 tokens a minute: each request reserves 400 and settles 300. Six fit.
        print(f"requests answered: {codes.count(200)}, refused: {codes.count(429)}")
        print(f"refused by: {response.json()['violated-policies']}")
        small: dict[str, str | int] = {"prompt": "hi", "max_tokens": 5}
        answers = [
            await client.get("/v1/completions", params=small, headers={"x-api-key": "b"})
            for _ in range(21)
        ]
        print(f"small answers: {sum(a.status_code == 200 for a in answers)} of 21 (20 a minute)")
    if REDIS is not None:
        await REDIS.aclose()


if __name__ == "__main__":
    asyncio.run(demo())
