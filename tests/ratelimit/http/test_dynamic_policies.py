"""Policies chosen per request (tiers), on the middleware, the decorator and the dependency."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway import (
    FixedWindow,
    Policy,
    RateLimitDependency,
    RateLimitEvent,
    RateLimitMiddleware,
    RateLimitRefused,
    Rule,
    rate_limit,
)
from headway._http import Scope, header
from tests.ratelimit.apps import client, sf_list
from tests.ratelimit.conftest import BackendFactory
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio

TIERS: dict[str, dict[str, Policy]] = {
    "free": {"free": FixedWindow(limit=2, window=NO_ROLLOVER)},
    "pro": {"pro": FixedWindow(limit=4, window=NO_ROLLOVER)},
}


class Directory:
    """Users and their tiers; counts the calls of the policies function."""

    def __init__(self) -> None:
        self.tiers = {"ann": "free", "bob": "pro"}
        self.calls = 0

    def user(self, scope: Scope) -> str | None:
        value = header(scope, b"x-user")
        return None if value is None else value.decode()

    def policies(self, scope: Scope) -> dict[str, Policy]:
        self.calls += 1
        return TIERS[self.tiers[self.user(scope) or "ann"]]

    async def policies_async(self, scope: Scope) -> dict[str, Policy]:
        return self.policies(scope)


async def hello(request: Request) -> Response:
    return JSONResponse({"ok": True})


def middleware(
    function: Callable[[Scope], Any], backend: BackendFactory | None = None, **rule: Any
) -> RateLimitMiddleware:
    app = Starlette(routes=[Route("/hello", hello)])
    return RateLimitMiddleware(
        app,
        rules=[Rule(function, name="tiers", **rule)],
        identity=Directory().user,
        backend=None if backend is None else backend(),
    )


async def statuses(app: Any, user: str, n: int) -> list[tuple[int, str | None]]:
    """``n`` requests of ``user``: each status and the policy its RateLimit field names."""
    out = []
    async with client(app) as http:
        for _ in range(n):
            response = await http.get("/hello", headers={"x-user": user})
            fields = response.headers.get("ratelimit")
            out.append(
                (response.status_code, None if fields is None else next(iter(sf_list(fields))))
            )
    return out


async def test_each_tier_gets_its_policies_named_in_the_headers(
    make_backend: BackendFactory,
) -> None:
    directory = Directory()
    app = middleware(directory.policies, make_backend)
    assert await statuses(app, "ann", 3) == [(200, "free"), (200, "free"), (429, "free")]
    assert await statuses(app, "bob", 5) == [(200, "pro")] * 4 + [(429, "pro")]
    async with client(app) as http:
        policy = (await http.get("/hello", headers={"x-user": "bob"})).headers["ratelimit-policy"]
    assert sf_list(policy) == {"pro": {"q": 4, "w": int(NO_ROLLOVER)}}


async def test_the_function_runs_per_request_and_what_is_built_is_cached() -> None:
    directory = Directory()
    app = middleware(directory.policies)
    await statuses(app, "ann", 3)
    await statuses(app, "bob", 3)
    dynamic = app.guard.rules[0].dynamic
    assert dynamic is not None
    assert directory.calls == 6
    assert len(dynamic.built) == 2  # one rule per distinct answer, not per request
    free = dynamic.built[next(iter(dynamic.built))]
    await statuses(app, "ann", 1)
    assert dynamic.built[next(reversed(dynamic.built))] is free  # reused, moved to the end


async def test_an_upgrade_applies_at_once_with_a_whole_quota_of_its_own(
    make_backend: BackendFactory,
) -> None:
    directory = Directory()
    app = middleware(directory.policies_async, make_backend)
    assert await statuses(app, "ann", 3) == [(200, "free"), (200, "free"), (429, "free")]
    directory.tiers["ann"] = "pro"
    assert await statuses(app, "ann", 5) == [(200, "pro")] * 4 + [(429, "pro")]
    directory.tiers["ann"] = "free"  # back down: the free quota's count is still there
    assert await statuses(app, "ann", 1) == [(429, "free")]


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda scope: "pro", id="a-str"),
        pytest.param(lambda scope: None, id="none"),
        pytest.param(lambda scope: {}, id="no-policies"),
        pytest.param(lambda scope: [{"pro": 1}], id="unhashable"),
        pytest.param(lambda scope: {"bad name\n": TIERS["pro"]["pro"]}, id="bad-name"),
        pytest.param(lambda scope: 1 / 0, id="raises"),
    ],
)
async def test_a_bad_answer_is_logged_once_and_the_rule_fails_open(
    answer: Callable[[Scope], Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = middleware(answer)
    with caplog.at_level(logging.ERROR, logger="headway.ratelimit"):
        assert await statuses(app, "ann", 4) == [(200, None)] * 4
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, caplog.text
    assert "'tiers'" in errors[0].getMessage()
    assert app.counts["tiers", "errored"] == 4


async def test_a_bad_answer_on_a_rule_failing_closed_is_a_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = middleware(lambda scope: "pro", fail="closed")
    with caplog.at_level(logging.ERROR, logger="headway.ratelimit"):
        async with client(app) as http:
            response = await http.get("/hello", headers={"x-user": "ann"})
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert "not policies" in caplog.text


def fastapi_app(policies: Callable[[Scope], Awaitable[dict[str, Policy]]]) -> FastAPI:
    app = FastAPI()
    app.add_exception_handler(RateLimitRefused, RateLimitRefused.handler)
    identity = Directory().user
    limit = RateLimitDependency(policies, name="tiers", identity=identity)

    @app.get("/hello", dependencies=[Depends(limit)])
    async def by_dependency() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/decorated")
    @rate_limit(policies, name="tiers", identity=identity)
    async def by_decorator() -> dict[str, bool]:
        return {"ok": True}

    return app


async def test_the_dependency_and_the_decorator_take_a_policies_function() -> None:
    directory = Directory()
    app = fastapi_app(directory.policies_async)
    assert await statuses(app, "ann", 3) == [(200, "free"), (200, "free"), (429, "free")]
    async with client(app) as http:
        decorated = [
            (await http.get("/decorated", headers={"x-user": "bob"})).status_code for _ in range(5)
        ]
    assert decorated == [200] * 4 + [429]


async def test_a_bad_answer_is_reported_to_the_hook_and_shadow_mode_only_reports_it() -> None:
    events: list[RateLimitEvent] = []
    app = Starlette(routes=[Route("/hello", hello)])

    def not_policies(scope: Scope) -> Any:
        return "pro"

    closed = Rule(not_policies, name="tiers", fail="closed", shadow=True)
    limited = RateLimitMiddleware(
        app, rules=[closed], identity=Directory().user, on_decision=events.append
    )
    assert await statuses(limited, "ann", 2) == [(200, None)] * 2
    assert [(e.rule, e.identity, e.outcome, e.shadow, e.cost) for e in events] == [
        ("tiers", "ann", "errored", True, 0)
    ] * 2
    assert events[0].decision.failed


async def test_a_request_no_identity_applies_to_does_not_call_the_function() -> None:
    directory = Directory()
    app = middleware(directory.policies)
    async with client(app) as http:
        response = await http.get("/hello")  # no x-user: the rule does not apply
    assert response.status_code == 200
    assert "ratelimit" not in response.headers
    assert directory.calls == 0
