"""RateLimitMiddleware over HTTP (httpx + ASGI transport) on Starlette and FastAPI apps."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from headway import (
    ApiKey,
    FixedWindow,
    RateLimitEvent,
    RateLimitMiddleware,
    Rule,
    SlidingLog,
    TokenBucket,
)
from headway._http import Receive, Scope, Send
from tests.ratelimit.apps import AppFactory, Calls, client, fastapi_app, sf_list, starlette_app
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio

# Fixed windows are aligned to the clock: tests that expect a refusal after N requests
# use day-long windows, so a minute boundary between two requests cannot reset them.
TEN = FixedWindow(limit=10, window=NO_ROLLOVER)
THREE = FixedWindow(limit=3, window=NO_ROLLOVER)


@pytest.fixture(params=[starlette_app, fastapi_app], ids=["starlette", "fastapi"])
def make_app(request: pytest.FixtureRequest) -> AppFactory:
    factory: AppFactory = request.param
    return factory


async def test_a_burst_is_cut_at_the_limit_with_a_well_formed_429(make_app: AppFactory) -> None:
    calls = Calls()
    app = make_app(calls, rules=[Rule(THREE, name="api")])
    async with client(app) as http:
        responses = [await http.get("/users/1") for _ in range(5)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429, 429]
    assert calls["user"] == 3
    assert [sf_list(r.headers["ratelimit"])["api"]["r"] for r in responses] == [2, 1, 0, 0, 0]
    refused = responses[3]
    assert sf_list(refused.headers["ratelimit-policy"]) == {"api": {"q": 3, "w": int(NO_ROLLOVER)}}
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.headers["cache-control"] == "no-store"
    retry = int(refused.headers["retry-after"])
    assert 1 <= retry <= NO_ROLLOVER
    assert retry == sf_list(refused.headers["ratelimit"])["api"]["t"]
    problem = refused.json()
    assert problem["type"] == "https://iana.org/assignments/http-problem-types#quota-exceeded"
    assert problem["status"] == 429
    assert problem["violated-policies"] == ["api"]
    assert "api" in problem["detail"]


async def test_several_policies_and_rules_report_one_item_each(make_app: AppFactory) -> None:
    rules = [
        Rule({"burst": TokenBucket(capacity=2, rate=1, period=1.0), "hourly": TEN}, name="api"),
        Rule(SlidingLog(limit=5, window=30.0), routes=["/users/{id}"], name="users"),
    ]
    app = make_app(Calls(), rules=rules)
    async with client(app) as http:
        first = await http.get("/users/7")
        second = await http.get("/users/8")
        third = await http.get("/users/9")
    assert sf_list(first.headers["ratelimit-policy"]) == {
        "burst": {"q": 2, "w": 2},
        "hourly": {"q": 10, "w": int(NO_ROLLOVER)},
        "users": {"q": 5, "w": 30},
    }
    assert sf_list(first.headers["ratelimit"]) == {
        "burst": {"r": 1, "t": 1},
        "hourly": {"r": 9, "t": first_reset(first, "hourly")},
        "users": {"r": 4, "t": 30},
    }
    assert second.status_code == 200
    assert third.status_code == 429
    assert third.json()["violated-policies"] == ["burst"]
    # The refused request stopped at the first rule: "users" was not charged for it.
    assert sf_list(second.headers["ratelimit"])["users"]["r"] == 3
    assert "users" not in sf_list(third.headers["ratelimit"])


def first_reset(response: Any, name: str) -> int:
    value: int = sf_list(response.headers["ratelimit"])[name]["t"]
    assert 0 < value <= NO_ROLLOVER
    return value


async def test_rules_decide_on_the_route_template(make_app: AppFactory) -> None:
    calls = Calls()
    rules = [Rule(THREE, routes=["/users/{id}"], name="users")]
    app = make_app(calls, rules=rules)
    async with client(app) as http:
        users = [await http.get(f"/users/{i}") for i in range(4)]
        order = await http.get("/orders/1")
    assert [r.status_code for r in users] == [200, 200, 200, 429]  # one quota for the template
    assert order.status_code == 200
    assert "ratelimit" not in order.headers
    assert "ratelimit-policy" not in order.headers


@pytest.mark.parametrize(("per", "expected"), [("route", 429), ("path", 200)])
async def test_per_route_or_per_path_quotas(make_app: AppFactory, per: str, expected: int) -> None:
    rules = [Rule(THREE, per=per, name="r")]  # type: ignore[arg-type]
    app = make_app(Calls(), rules=rules)
    async with client(app) as http:
        for i in range(3):
            assert (await http.get(f"/users/{i}")).status_code == 200
        assert (await http.get("/orders/1")).status_code == 200  # another route, its own quota
        assert (await http.get("/users/99")).status_code == expected


async def test_templates_inside_mounts_and_routers(make_app: AppFactory) -> None:
    rules = [Rule(THREE, routes=["/v2/items/{item}"], name="items")]
    app = make_app(Calls(), rules=rules)
    async with client(app) as http:
        statuses = [(await http.get(f"/v2/items/{i}")).status_code for i in range(4)]
    assert statuses == [200, 200, 200, 429]


async def test_globs_regexes_methods_and_exemptions(make_app: AppFactory) -> None:
    calls = Calls()
    rules = [
        Rule(FixedWindow(limit=1, window=NO_ROLLOVER), routes=["/v2/*"], name="v2"),
        Rule(
            FixedWindow(limit=1, window=NO_ROLLOVER),
            routes=[re.compile(r"^/orders/")],
            name="orders",
        ),
        Rule(FixedWindow(limit=1, window=NO_ROLLOVER), methods=["POST"], name="writes"),
        Rule(FixedWindow(limit=1, window=NO_ROLLOVER), routes=["/users/*"], exempt=["/users/{id}"]),
    ]
    app = make_app(calls, rules=rules, exempt=["/health"])
    async with client(app) as http:
        assert [(await http.get("/v2/items/a")).status_code for _ in range(2)] == [200, 429]
        assert [(await http.get("/orders/x")).status_code for _ in range(2)] == [200, 429]
        assert [(await http.post("/upload", content=b"x")).status_code for _ in range(2)] == [
            200,
            429,
        ]
        assert [(await http.get("/users/1")).status_code for _ in range(3)] == [200] * 3
        health = [await http.get("/health") for _ in range(3)]
    assert [r.status_code for r in health] == [200] * 3
    assert "ratelimit" not in health[0].headers


async def test_costs_constant_and_computed(make_app: AppFactory) -> None:
    def by_size(scope: Scope) -> int:
        headers = dict(scope["headers"])
        return max(1, int(headers.get(b"content-length", b"0")) // 10)

    rules = [
        Rule(TEN, methods=["GET"], cost=4, name="reads"),
        Rule(TEN, methods=["POST"], cost=by_size, name="writes"),
    ]
    app = make_app(Calls(), rules=rules)
    async with client(app) as http:
        reads = [await http.get("/users/1") for _ in range(3)]
        write = await http.post("/upload", content=b"x" * 70)
        too_big = await http.post("/upload", content=b"x" * 40)
    assert [r.status_code for r in reads] == [200, 200, 429]
    assert sf_list(reads[1].headers["ratelimit"])["reads"]["r"] == 2
    assert write.status_code == 200
    assert sf_list(write.headers["ratelimit"])["writes"]["r"] == 3
    assert too_big.status_code == 429


async def test_api_keys_get_their_own_quotas_and_keyless_requests_fall_back(
    make_app: AppFactory,
) -> None:
    rules = [Rule(FixedWindow(limit=2, window=NO_ROLLOVER), identity=[ApiKey(), lambda _: "anon"])]
    app = make_app(Calls(), rules=rules)
    async with client(app) as http:
        alice = [await http.get("/users/1", headers={"x-api-key": "alice"}) for _ in range(3)]
        bob = await http.get("/users/1", headers={"x-api-key": "bob"})
        anonymous = [await http.get("/users/1") for _ in range(3)]
    assert [r.status_code for r in alice] == [200, 200, 429]
    assert bob.status_code == 200
    assert [r.status_code for r in anonymous] == [200, 200, 429]


async def test_an_identity_returning_none_skips_the_rule(make_app: AppFactory) -> None:
    async def nobody(scope: Scope) -> str | None:
        return None

    app = make_app(Calls(), rules=[Rule(FixedWindow(limit=1, window=NO_ROLLOVER), identity=nobody)])
    async with client(app) as http:
        responses = [await http.get("/users/1") for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3
    assert "ratelimit" not in responses[0].headers


async def test_legacy_headers_are_opt_in(make_app: AppFactory) -> None:
    app = make_app(Calls(), rules=[Rule(THREE)], legacy_headers=True)
    plain = make_app(Calls(), rules=[Rule(THREE)])
    async with client(app) as http, client(plain) as other:
        response = await http.get("/users/1")
        without = await other.get("/users/1")
    assert response.headers["x-ratelimit-limit"] == "3"
    assert response.headers["x-ratelimit-remaining"] == "2"
    assert 1 <= int(response.headers["x-ratelimit-reset"]) <= NO_ROLLOVER
    assert "x-ratelimit-limit" not in without.headers


async def test_shadow_mode_reports_and_sets_headers_but_never_refuses(
    make_app: AppFactory,
) -> None:
    events: list[RateLimitEvent] = []
    calls = Calls()
    app = make_app(calls, rules=[Rule(THREE, name="api")], shadow=True, on_decision=events.append)
    async with client(app) as http:
        responses = [await http.get("/users/1") for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5
    assert calls["user"] == 5
    assert sf_list(responses[4].headers["ratelimit"])["api"]["r"] == 0
    assert [(e.outcome, e.shadow) for e in events] == [("allowed", False)] * 3 + [
        ("rejected", True)
    ] * 2


async def test_one_rule_in_shadow_mode(make_app: AppFactory) -> None:
    rules = [Rule(FixedWindow(limit=1, window=NO_ROLLOVER), name="trial", shadow=True), Rule(THREE)]
    app = make_app(Calls(), rules=rules)
    async with client(app) as http:
        statuses = [(await http.get("/users/1")).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]


async def test_the_hook_sees_every_decision_and_may_be_async_or_broken(
    make_app: AppFactory,
) -> None:
    seen: list[tuple[str, str, str | None, str, int]] = []

    async def hook(event: RateLimitEvent) -> None:
        seen.append((event.rule, event.outcome, event.route, event.identity, event.cost))
        raise RuntimeError("a broken metrics exporter")

    app = make_app(
        Calls(), rules=[Rule(FixedWindow(limit=1, window=NO_ROLLOVER))], on_decision=hook
    )
    async with client(app, ip="198.51.100.7") as http:
        statuses = [(await http.get("/users/3")).status_code for _ in range(2)]
    assert statuses == [200, 429]
    ident = "ip@198.51.100.7"
    assert seen == [
        ("default", "allowed", "/users/{id}", ident, 1),
        ("default", "rejected", "/users/{id}", ident, 1),
    ]


async def test_counts_by_rule_and_outcome(make_app: AppFactory) -> None:
    app = make_app(Calls(), rules=[Rule(FixedWindow(limit=1, window=NO_ROLLOVER), name="api")])
    async with client(app) as http:
        for _ in range(3):
            await http.get("/users/1")
    middleware = find_middleware(app)
    assert middleware.counts == {("api", "allowed"): 1, ("api", "rejected"): 2}


def find_middleware(app: Any) -> RateLimitMiddleware:
    layer = app.middleware_stack
    while not isinstance(layer, RateLimitMiddleware):
        layer = layer.app
    return layer


async def test_lifespan_and_other_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    middleware = RateLimitMiddleware(app, rules=[Rule(FixedWindow(limit=1, window=NO_ROLLOVER))])
    for _ in range(3):
        await middleware({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
        await middleware({"type": "websocket", "path": "/ws"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan", "websocket"] * 3


async def test_a_plain_asgi_app_is_limited_on_its_raw_path() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    rules = [Rule(FixedWindow(limit=1, window=NO_ROLLOVER), routes=["/ping"])]
    async with client(RateLimitMiddleware(app, rules=rules)) as http:
        statuses = [(await http.get("/ping")).status_code for _ in range(2)]
        other = await http.get("/pong")
    assert statuses == [204, 429]
    assert other.status_code == 204


async def test_websocket_connection_attempts_can_be_limited() -> None:
    calls = Calls()
    app = starlette_app(
        calls, rules=[Rule(FixedWindow(limit=1, window=NO_ROLLOVER))], websocket=True
    )
    transcripts = [await websocket_attempt(app) for _ in range(2)]
    assert transcripts[0][0]["type"] == "websocket.accept"
    assert sf_list(header(transcripts[0][0], b"ratelimit"))["default"]["r"] == 0
    start, body = transcripts[1]
    assert start["type"] == "websocket.http.response.start"
    assert start["status"] == 429
    assert json.loads(body["body"])["violated-policies"] == ["default"]
    assert calls["ws"] == 1


def header(message: dict[str, Any], name: bytes) -> str:
    value: bytes = next(v for k, v in message["headers"] if k == name)
    return value.decode()


async def websocket_attempt(app: Any) -> list[dict[str, Any]]:
    """Open /ws as an ASGI server would (with the denial-response extension)."""
    incoming = [{"type": "websocket.connect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "websocket.disconnect", "code": 1000}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "path": "/ws",
        "raw_path": b"/ws",
        "root_path": "",
        "scheme": "ws",
        "query_string": b"",
        "headers": [(b"host", b"test")],
        "client": ("192.0.2.9", 5000),
        "server": ("test", 80),
        "subprotocols": [],
        "extensions": {"websocket.http.response": {}},
    }
    await app(scope, receive, send)
    return sent


def test_rule_and_middleware_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="name"):
        Rule(THREE, name="has space")
    with pytest.raises(TypeError, match="list of patterns"):
        Rule(THREE, routes="/users/{id}")
    with pytest.raises(ValueError, match="per"):
        Rule(THREE, per="user")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one policy"):
        Rule([])
    with pytest.raises(ValueError, match="unique"):
        RateLimitMiddleware(starlette_app(Calls()), rules=[Rule(THREE), Rule(TEN)])
    with pytest.raises(TypeError, match="list of Rule"):
        RateLimitMiddleware(starlette_app(Calls()), rules=Rule(THREE))  # type: ignore[arg-type]


async def test_a_route_function_names_templates_for_other_frameworks() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def template(scope: Scope) -> str | None:
        parts = scope["path"].split("/")
        return "/items/{id}" if len(parts) == 3 and parts[1] == "items" else None

    rules = [Rule(FixedWindow(limit=2, window=NO_ROLLOVER), routes=["/items/{id}"], per="route")]
    middleware = RateLimitMiddleware(app, rules=rules, route=template)
    async with client(middleware) as http:
        statuses = [(await http.get(f"/items/{i}")).status_code for i in range(3)]
        other = await http.get("/other")
    assert statuses == [200, 200, 429]
    assert "ratelimit" not in other.headers
