"""The ``rate_limit`` decorator on Starlette and FastAPI endpoints, async and sync."""

from __future__ import annotations

import inspect
import socket
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from headway import (
    FixedWindow,
    LimiterSettings,
    MemoryRateLimitBackend,
    RateLimitEvent,
    RedisRateLimitBackend,
    rate_limit,
)
from tests.ratelimit.apps import client, sf_list
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio

TWO = FixedWindow(limit=2, window=NO_ROLLOVER)


class Item(BaseModel):
    name: str
    size: int


def fastapi_app(events: list[RateLimitEvent]) -> FastAPI:
    app = FastAPI()
    backend = MemoryRateLimitBackend()

    @app.get("/async/{user_id}")
    @rate_limit(TWO, name="reads", backend=backend, on_decision=events.append)
    async def read(user_id: int, verbose: bool = False) -> dict[str, object]:
        return {"user": user_id, "verbose": verbose}

    @app.post("/sync")
    @rate_limit(TWO, backend=backend)
    def create(item: Item) -> dict[str, object]:
        return {"created": item.name, "size": item.size}

    @app.get("/plain")
    @rate_limit(TWO, backend=backend)
    async def plain() -> Response:
        return PlainTextResponse("plain")

    @app.get("/uses-request")
    @rate_limit(TWO, backend=backend)
    def uses_request(request: Request, response: Response) -> dict[str, str]:
        response.headers["x-own"] = "kept"
        return {"path": request.url.path}

    return app


async def test_fastapi_async_and_sync_handlers_without_a_request_argument() -> None:
    events: list[RateLimitEvent] = []
    async with client(fastapi_app(events)) as http:
        reads = [await http.get("/async/7", params={"verbose": "true"}) for _ in range(3)]
        writes = [await http.post("/sync", json={"name": "a", "size": 3}) for _ in range(3)]
        invalid = await http.post("/sync", json={"name": "a"})
    assert [r.status_code for r in reads] == [200, 200, 429]
    assert reads[0].json() == {"user": 7, "verbose": True}
    assert sf_list(reads[0].headers["ratelimit"])["reads"]["r"] == 1
    assert sf_list(reads[0].headers["ratelimit-policy"]) == {
        "reads": {"q": 2, "w": int(NO_ROLLOVER)}
    }
    refused = reads[2]
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.headers["cache-control"] == "no-store"
    assert refused.json()["violated-policies"] == ["reads"]
    assert (
        int(refused.headers["retry-after"]) == sf_list(refused.headers["ratelimit"])["reads"]["t"]
    )
    assert [r.status_code for r in writes] == [200, 200, 429]
    assert writes[0].json() == {"created": "a", "size": 3}
    assert "create" in sf_list(writes[0].headers["ratelimit"])  # default name: the function's
    # FastAPI validates before it calls the handler: an invalid request is refused uncharged.
    assert invalid.status_code == 422
    assert [e.outcome for e in events] == ["allowed", "allowed", "rejected"]
    assert events[0].route == "/async/{user_id}"


async def test_fastapi_handlers_returning_responses_or_taking_the_request() -> None:
    async with client(fastapi_app([])) as http:
        plain = await http.get("/plain")
        uses = await http.get("/uses-request")
    assert plain.text == "plain"
    assert sf_list(plain.headers["ratelimit"])["plain"]["r"] == 1
    assert uses.json() == {"path": "/uses-request"}
    assert uses.headers["x-own"] == "kept"
    assert sf_list(uses.headers["ratelimit"])["uses_request"]["r"] == 1


def test_the_signature_is_kept_and_fastapi_sees_no_extra_parameter() -> None:
    app = fastapi_app([])
    schema = app.openapi()
    params = [p["name"] for p in schema["paths"]["/async/{user_id}"]["get"]["parameters"]]
    assert params == ["user_id", "verbose"]
    read = next(r for r in app.routes if getattr(r, "path", "") == "/async/{user_id}")
    endpoint = read.endpoint  # type: ignore[attr-defined]
    assert inspect.iscoroutinefunction(endpoint)
    assert endpoint.__name__ == "read"
    assert list(inspect.signature(endpoint.__wrapped__).parameters) == ["user_id", "verbose"]


def starlette_app() -> Starlette:
    backend = MemoryRateLimitBackend()

    @rate_limit(TWO, backend=backend)
    async def hello(request: Request) -> Response:
        return JSONResponse({"hello": request.path_params["name"]})

    @rate_limit(TWO, backend=backend)
    def sync_hello(request: Request) -> Response:
        return JSONResponse({"sync": True})

    @rate_limit(TWO, name="shared", backend=backend)
    async def one(request: Request) -> Response:
        return JSONResponse({"one": True})

    @rate_limit(TWO, name="shared", backend=backend)
    async def two(request: Request) -> Response:
        return JSONResponse({"two": True})

    return Starlette(
        routes=[
            Route("/hello/{name}", hello),
            Route("/sync", sync_hello),
            Route("/one", one),
            Route("/two", two),
        ]
    )


async def test_starlette_async_and_sync_endpoints() -> None:
    async with client(starlette_app()) as http:
        hello = [(await http.get(f"/hello/{n}")) for n in ("a", "b", "c")]
        sync = [(await http.get("/sync")) for _ in range(3)]
    assert [r.status_code for r in hello] == [200, 200, 429]
    assert hello[1].json() == {"hello": "b"}
    assert sf_list(hello[0].headers["ratelimit"])["hello"]["r"] == 1
    assert [r.status_code for r in sync] == [200, 200, 429]
    assert sf_list(sync[2].headers["ratelimit"])["sync_hello"]["r"] == 0


async def test_endpoints_share_a_quota_when_given_the_same_name_and_backend() -> None:
    async with client(starlette_app()) as http:
        statuses = [(await http.get(path)).status_code for path in ("/one", "/two", "/one")]
        other_client = client(starlette_app(), ip="192.0.2.99")
    assert statuses == [200, 200, 429]
    async with other_client as http:
        assert (await http.get("/one")).status_code == 200


async def test_the_same_name_without_the_same_backend_is_not_one_quota() -> None:
    """Without ``backend=``, each endpoint has its own in-memory backend (docs say so)."""

    @rate_limit(TWO, name="unshared")
    async def one(request: Request) -> Response:
        return JSONResponse({"one": True})

    @rate_limit(TWO, name="unshared")
    async def two(request: Request) -> Response:
        return JSONResponse({"two": True})

    app = Starlette(routes=[Route("/one", one), Route("/two", two)])
    async with client(app) as http:
        paths = ("/one", "/two", "/one", "/two", "/one", "/two")
        statuses = [(await http.get(path)).status_code for path in paths]
    assert statuses == [200, 200, 200, 200, 429, 429]


async def test_calling_a_decorated_function_without_a_request_is_an_error() -> None:
    @rate_limit(TWO)
    async def not_an_endpoint(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="no request"):
        await not_an_endpoint(1)


def test_policies_or_named_policies_not_both() -> None:
    with pytest.raises(TypeError, match="not both"):
        rate_limit(TWO, named={"a": TWO})
    with pytest.raises(ValueError, match="at least one policy"):
        rate_limit()


def test_the_decorated_function_keeps_its_static_types() -> None:
    @rate_limit(TWO)
    async def handler(user_id: int, *, verbose: bool = False) -> dict[str, int]:
        return {"user": user_id}

    @rate_limit(TWO)
    def sync_handler(name: str) -> str:
        return name

    kept: Callable[[int], Coroutine[Any, Any, dict[str, int] | Response]] = handler
    sync_kept: Callable[[str], str | Response] = sync_handler
    assert kept is handler
    assert sync_kept is sync_handler
    if TYPE_CHECKING:  # mypy (strict, warn_unused_ignores) proves the parameters are kept
        _ = handler("seven")  # type: ignore[arg-type]
        sync_handler(name=7)  # type: ignore[arg-type]


async def test_limiter_settings_reach_the_endpoints_limiter() -> None:
    """``limiter=LimiterSettings(...)``: a fail-closed rule on a Redis nobody listens on."""
    with socket.socket() as probe:  # a free port, closed again: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backend = RedisRateLimitBackend.from_url(f"redis://127.0.0.1:{port}/0", timeout=0.5)
    settings = LimiterSettings(budget=0.5, retry_on_error=7.0)

    @rate_limit(TWO, fail="closed", backend=backend, limiter=settings)
    async def guarded(request: Request) -> Response:
        return PlainTextResponse("ran")

    @rate_limit(TWO, fail="closed", backend=backend, limiter=settings)
    def guarded_sync(request: Request) -> Response:
        return PlainTextResponse("ran")

    app = Starlette(routes=[Route("/async", guarded), Route("/sync", guarded_sync)])
    try:
        async with client(app) as http:
            refused = [await http.get("/async"), await http.get("/sync")]
    finally:
        await backend.client.aclose()
    for response in refused:
        assert response.status_code == 503
        assert response.headers["retry-after"] == "7"
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        # draft -11's problem type for a server that cannot serve for now, naming the policies
        assert problem["type"] == (
            "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
        )
        assert problem["title"] == "Temporary Reduced Capacity"
        assert problem["status"] == 503
        assert problem["violated-policies"] == list(sf_list(response.headers["ratelimit-policy"]))
