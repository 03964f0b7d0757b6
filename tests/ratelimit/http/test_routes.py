"""``RouteCache``: a request's template, cached, and seen again when the routes change."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from headway.ratelimit.http.routes import RouteCache


async def endpoint(request: Any) -> PlainTextResponse:
    return PlainTextResponse("ok")


def request(path: str) -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": path, "root_path": "", "headers": []}


def test_a_route_added_after_requests_is_seen() -> None:
    app = Starlette(routes=[Route("/items/{id}", endpoint)])
    route = RouteCache(app)
    assert route(request("/items/1")) == "/items/{id}"
    assert route(request("/users/7")) is None  # cached: no route matches
    app.router.routes.append(Route("/users/{id}", endpoint))
    assert route(request("/users/7")) == "/users/{id}"
    assert route(request("/items/1")) == "/items/{id}"


def test_a_route_list_replaced_by_one_of_the_same_length_is_seen() -> None:
    app = Starlette(routes=[Route("/items/{id}", endpoint)])
    route = RouteCache(app)
    assert route(request("/users/7")) is None
    app.router.routes = [Route("/users/{uid}", endpoint)]
    assert route(request("/users/7")) == "/users/{uid}"
