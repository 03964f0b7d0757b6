"""The benchmarked app, one FastAPI endpoint, bare or behind each rate limiter.

``make_app()`` reads ``BENCH_SUBJECT`` and ``BENCH_REDIS_URL`` from the
environment, so uvicorn can build the same apps in a server process
(``uvicorn _mw_apps:make_app --factory``). Every limiter gets a limit no
benchmark reaches, so every request is admitted and the numbers are the cost
of deciding, not of refusing.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from redis import asyncio as aioredis

HUGE = 500_000  # per hour: never reached by a run (and exact for every algorithm)

#: name -> what it is (the README's table)
SUBJECTS = {
    "bare": "the app alone",
    "one decision": "the app whose endpoint awaits one RateLimiter.hit: a decision, in situ",
    "headway middleware": "RateLimitMiddleware, FixedWindow, per client address",
    "headway, in memory": "the same middleware on the in-memory backend: its own cost, no Redis",
    "headway decorator": "@rate_limit on the endpoint, FixedWindow",
    "slowapi": "SlowAPIASGIMiddleware + default limit, fixed window (limits, sync redis)",
    "fastapi-limiter": "Depends(RateLimiter) on pyrate-limiter's RedisBucket (sliding log)",
}


async def ping() -> dict[str, bool]:
    return {"ok": True}


def bare(url: str) -> FastAPI:
    app = FastAPI()
    app.get("/ping")(ping)
    return app


def one_decision(url: str) -> FastAPI:
    """The bare app whose endpoint first awaits one limiter decision (no middleware).

    What a decision costs where the middleware makes it: inside a request, between
    the server's work (the floor's tight loop of lone decisions runs hotter).
    """
    from headway import FixedWindow, RateLimiter, RedisRateLimitBackend

    limiter = RateLimiter(
        FixedWindow(HUGE, 3600.0), backend=RedisRateLimitBackend(aioredis.Redis.from_url(url))
    )

    async def decided() -> dict[str, bool]:
        await limiter.hit("127.0.0.1")
        return {"ok": True}

    app = FastAPI()
    app.get("/ping")(decided)
    return app


def headway_middleware(url: str) -> FastAPI:
    from headway import FixedWindow, RateLimitMiddleware, RedisRateLimitBackend, Rule

    app = bare(url)
    backend = RedisRateLimitBackend(aioredis.Redis.from_url(url))
    app.add_middleware(
        RateLimitMiddleware, rules=[Rule(FixedWindow(HUGE, 3600.0))], backend=backend
    )
    return app


def headway_in_memory(url: str) -> FastAPI:
    from headway import FixedWindow, RateLimitMiddleware, Rule

    app = bare(url)
    app.add_middleware(RateLimitMiddleware, rules=[Rule(FixedWindow(HUGE, 3600.0))])
    return app


def headway_decorator(url: str) -> FastAPI:
    from headway import FixedWindow, RedisRateLimitBackend, rate_limit

    app = FastAPI()
    backend = RedisRateLimitBackend(aioredis.Redis.from_url(url))
    app.get("/ping")(rate_limit(FixedWindow(HUGE, 3600.0), backend=backend)(ping))
    return app


def slowapi(url: str) -> FastAPI:
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.middleware import SlowAPIASGIMiddleware
    from slowapi.util import get_remote_address

    app = bare(url)
    limiter = Limiter(
        key_func=get_remote_address,
        default_limits=[f"{HUGE}/hour"],
        storage_uri=url,
        strategy="fixed-window",
    )
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
    app.add_middleware(SlowAPIASGIMiddleware)
    return app


def fastapi_limiter(url: str) -> FastAPI:
    from fastapi_limiter.depends import RateLimiter
    from pyrate_limiter import Duration, InMemoryBucket, Limiter, Rate, RedisBucket

    rates = [Rate(HUGE, Duration.HOUR)]
    dependency = RateLimiter(limiter=Limiter(InMemoryBucket(rates)))  # replaced at startup

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # With an asyncio client RedisBucket.init is a coroutine: build it on startup.
        client = aioredis.Redis.from_url(url)
        bucket = await RedisBucket.init(rates, client, "bench:fastapi-limiter")
        dependency.limiter = Limiter(bucket)
        yield
        await client.aclose()

    app = FastAPI(lifespan=lifespan)
    app.get("/ping", dependencies=[Depends(dependency)])(ping)
    return app


BUILDERS = {
    "bare": bare,
    "one decision": one_decision,
    "headway middleware": headway_middleware,
    "headway, in memory": headway_in_memory,
    "headway decorator": headway_decorator,
    "slowapi": slowapi,
    "fastapi-limiter": fastapi_limiter,
}


def build(subject: str, url: str) -> FastAPI:
    """The app for ``subject`` on the Redis at ``url``."""
    return BUILDERS[subject](url)


def make_app() -> FastAPI:
    """uvicorn's factory: the subject and Redis URL come from the environment."""
    return build(os.environ["BENCH_SUBJECT"], os.environ["BENCH_REDIS_URL"])
