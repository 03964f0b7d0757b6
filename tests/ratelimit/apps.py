"""The same small API on Starlette and on FastAPI, with a call counter, and test helpers."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import APIRouter, FastAPI
from http_sfv.list import List as SfvList
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.websockets import WebSocket

from headway import RateLimitMiddleware

AppFactory = Callable[..., Any]
Calls = collections.Counter[str]


def starlette_app(calls: Calls, **options: Any) -> Starlette:
    """Routes: /users/{id:int}, /orders/{id}, /health, POST /upload, /v2/items/{item}, /ws."""

    async def user(request: Request) -> Response:
        calls["user"] += 1
        return JSONResponse({"user": request.path_params["id"]})

    async def order(request: Request) -> Response:
        calls["order"] += 1
        return JSONResponse({"order": request.path_params["id"]})

    async def health(request: Request) -> Response:
        calls["health"] += 1
        return JSONResponse({"ok": True})

    async def upload(request: Request) -> Response:
        calls["upload"] += 1
        return JSONResponse({"size": len(await request.body())})

    async def item(request: Request) -> Response:
        calls["item"] += 1
        return JSONResponse({"item": request.path_params["item"]})

    async def ws(websocket: WebSocket) -> None:
        calls["ws"] += 1
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    routes = [
        Route("/users/{id:int}", user),
        Route("/orders/{id}", order),
        Route("/health", health),
        Route("/upload", upload, methods=["POST"]),
        Mount("/v2", routes=[Route("/items/{item}", item)]),
        WebSocketRoute("/ws", ws),
    ]
    return Starlette(routes=routes, middleware=[Middleware(RateLimitMiddleware, **options)])


def fastapi_app(calls: Calls, **options: Any) -> FastAPI:
    """The same API on FastAPI (the /v2 routes come from an included router)."""
    app = FastAPI()
    v2 = APIRouter(prefix="/v2")

    @app.get("/users/{id}")
    async def user(id: int) -> dict[str, int]:
        calls["user"] += 1
        return {"user": id}

    @app.get("/orders/{id}")
    def order(id: str) -> dict[str, str]:
        calls["order"] += 1
        return {"order": id}

    @app.get("/health")
    async def health() -> dict[str, bool]:
        calls["health"] += 1
        return {"ok": True}

    @app.post("/upload")
    async def upload(request: Request) -> dict[str, int]:
        calls["upload"] += 1
        return {"size": len(await request.body())}

    @v2.get("/items/{item}")
    async def item(item: str) -> dict[str, str]:
        calls["item"] += 1
        return {"item": item}

    app.include_router(v2)
    app.add_middleware(RateLimitMiddleware, **options)
    return app


def client(app: Any, ip: str = "192.0.2.1") -> httpx.AsyncClient:
    """An in-process client whose requests come from ``ip``."""
    transport = httpx.ASGITransport(app=app, client=(ip, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def sf_list(value: str | None) -> dict[str, dict[str, Any]]:
    """A RateLimit / RateLimit-Policy value parsed by http_sfv: {policy name: parameters}."""
    assert value is not None, "the header field is missing"
    parsed = SfvList()
    parsed.parse(value.encode("ascii"))
    out: dict[str, dict[str, Any]] = {}
    for item in parsed:
        assert isinstance(item.value, str), f"policy names are Strings: {item.value!r}"
        out[item.value] = dict(item.params)
    return out
