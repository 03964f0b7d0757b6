"""``on_refusal`` on the middleware, the decorator and the dependency: shaped, or the default."""

from __future__ import annotations

import collections
import logging
import re
import socket
from collections.abc import Callable
from typing import Any

import pytest
from fastapi import Depends, FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from headway import (
    FixedWindow,
    LimiterSettings,
    RateLimitDependency,
    RateLimitRefused,
    RedisRateLimitBackend,
    RefusalContext,
    RefusalHook,
    Rule,
    rate_limit,
)
from tests.ratelimit.apps import client, starlette_app
from tests.ratelimit.http.test_middleware import websocket_attempt
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio

ONE = FixedWindow(limit=1, window=NO_ROLLOVER)
FAST = LimiterSettings(budget=0.5, retry_on_error=3.0)


def unreachable_redis() -> RedisRateLimitBackend:
    """A Redis backend on a port nobody listens on: every decision fails."""
    with socket.socket() as probe:  # a free port, closed again: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return RedisRateLimitBackend.from_url(f"redis://127.0.0.1:{port}/0", timeout=0.5)


def middleware_app(hook: RefusalHook, backend: Any = None, **rule: Any) -> Any:
    calls: collections.Counter[str] = collections.Counter()
    rules = [Rule(ONE, name="users", **rule)]
    return starlette_app(calls, rules=rules, backend=backend, on_refusal=hook, limiter=FAST)


def decorator_app(hook: RefusalHook, **rule: Any) -> Any:
    app = FastAPI()

    @app.get("/users/{id}")
    @rate_limit(ONE, name="users", on_refusal=hook, limiter=FAST, **rule)
    async def user(id: int) -> dict[str, int]:
        return {"user": id}

    return app


def dependency_app(hook: RefusalHook, **rule: Any) -> Any:
    app = FastAPI()
    app.add_exception_handler(RateLimitRefused, RateLimitRefused.handler)
    limit = RateLimitDependency(ONE, name="users", on_refusal=hook, limiter=FAST, **rule)

    @app.get("/users/{id}", dependencies=[Depends(limit)])
    async def user(id: int) -> dict[str, int]:
        return {"user": id}

    return app


FACES: dict[str, Callable[..., Any]] = {
    "middleware": middleware_app,
    "decorator": decorator_app,
    "dependency": dependency_app,
}


@pytest.fixture(params=list(FACES))
def face(request: pytest.FixtureRequest) -> Callable[..., Any]:
    return FACES[request.param]


async def refused(app: Any) -> Any:
    async with client(app) as http:
        assert (await http.get("/users/1")).status_code == 200
        return await http.get("/users/1")


async def test_a_hook_builds_the_whole_response(face: Callable[..., Any]) -> None:
    seen: list[RefusalContext] = []

    def hook(context: RefusalContext) -> Response:
        seen.append(context)
        return JSONResponse(
            {"error": "slow down", "wait": context.retry_after},
            status_code=context.status,
            headers={"retry-after": context.headers["retry-after"], "x-shaped": "yes"},
        )

    response = await refused(face(hook))
    assert response.status_code == 429
    assert response.headers["x-shaped"] == "yes"
    assert response.json() == {"error": "slow down", "wait": int(response.headers["retry-after"])}
    (context,) = seen
    assert context.rule == "users"
    assert context.violated == ("users",)
    assert context.status == 429
    assert not context.decision.allowed
    assert context.problem["status"] == 429
    assert "ratelimit" in context.headers
    assert "content-type" not in context.headers
    assert context.scope["path"] == "/users/1"


async def test_an_async_hook_adds_members_to_the_problem(face: Callable[..., Any]) -> None:
    async def hook(context: RefusalContext) -> dict[str, Any]:
        return {"upgrade": "https://example.com/pricing", "detail": "Upgrade for more."}

    response = await refused(face(hook))
    assert response.status_code == 429
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["upgrade"] == "https://example.com/pricing"
    assert body["detail"] == "Upgrade for more."
    assert body["violated-policies"] == ["users"]
    assert body["status"] == 429
    assert int(response.headers["content-length"]) == len(response.content)


async def test_a_hook_returning_none_keeps_the_default(face: Callable[..., Any]) -> None:
    response = await refused(face(lambda context: None))
    assert response.status_code == 429
    assert response.json()["violated-policies"] == ["users"]


@pytest.mark.parametrize(
    "hook",
    [
        pytest.param(lambda context: 1 / 0, id="raises"),
        pytest.param(lambda context: "429", id="not-a-response"),
        pytest.param(lambda context: {"status": 400}, id="replaces-status"),
        pytest.param(lambda context: {"when": object()}, id="not-json"),
    ],
)
async def test_a_broken_hook_falls_back_to_the_default_refusal_and_is_logged(
    face: Callable[..., Any], hook: RefusalHook, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="headway.ratelimit"):
        response = await refused(face(hook))
    assert response.status_code == 429
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["violated-policies"] == ["users"]
    assert "on_refusal hook failed" in caplog.text


async def test_the_hook_shapes_the_503_of_a_rule_failing_closed(
    face: Callable[..., Any],
) -> None:
    contexts: list[RefusalContext] = []

    def hook(context: RefusalContext) -> dict[str, str]:
        contexts.append(context)
        return {"status-page": "https://status.example.com"}

    backend = unreachable_redis()
    try:
        app = face(hook, fail="closed", backend=backend)
        async with client(app) as http:
            response = await http.get("/users/1")
    finally:
        await backend.client.aclose()
    assert response.status_code == 503
    assert response.headers["retry-after"] == "3"
    assert response.json()["status-page"] == "https://status.example.com"
    (context,) = contexts
    assert context.status == 503
    assert context.violated == ()
    assert context.decision.failed


async def test_a_request_object_is_not_needed_by_the_hook() -> None:
    # The context carries the scope; a hook wanting a Request builds one from it.
    def hook(context: RefusalContext) -> dict[str, str]:
        return {"instance": Request(context.scope).url.path}

    response = await refused(decorator_app(hook))
    assert response.json()["instance"] == "/users/1"


async def test_a_refused_websocket_handshake_gets_the_hooks_response() -> None:
    def hook(context: RefusalContext) -> Response:
        return JSONResponse({"error": "busy"}, status_code=429, headers=dict(context.headers))

    calls: collections.Counter[str] = collections.Counter()
    app = starlette_app(calls, rules=[Rule(ONE)], websocket=True, on_refusal=hook)
    await websocket_attempt(app)
    start, body = await websocket_attempt(app)
    assert start["type"] == "websocket.http.response.start"
    assert start["status"] == 429
    sent = dict(start["headers"])
    # The hook passed the refusal's headers on: Retry-After is the refusing policy's ``t``.
    t = re.search(rb";t=(\d+)", sent[b"ratelimit"])
    assert t is not None
    assert sent[b"retry-after"] == t.group(1)
    assert body["body"] == b'{"error":"busy"}'
    assert calls["ws"] == 1
