"""The per-route decorator on Starlette, and the middleware under FastAPI."""

import itertools

import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway import IdempotencyMiddleware, RecordStore, idempotent

from .test_middleware import connect

pytestmark = pytest.mark.anyio


async def test_decorator_guards_one_route(store: RecordStore) -> None:
    ids = itertools.count(1)

    @idempotent(store=store, required=True)
    async def create(request: Request) -> Response:
        return JSONResponse({"id": next(ids)}, status_code=201)

    async def other(request: Request) -> Response:
        return JSONResponse({"id": next(ids)})

    app = Starlette(
        routes=[
            Route("/guarded", create, methods=["POST"]),
            Route("/free", other, methods=["POST"]),
        ]
    )
    async with connect(app) as client:
        first = await client.post("/guarded", headers={"idempotency-key": "k"})
        again = await client.post("/guarded", headers={"idempotency-key": "k"})
        missing = await client.post("/guarded")
        free = await client.post("/free", headers={"idempotency-key": "k"})
    assert first.json() == again.json() == {"id": 1}
    assert again.headers["idempotent-replayed"] == "true"
    assert missing.status_code == 400
    assert free.json() == {"id": 2}


async def test_fastapi_app(store: RecordStore) -> None:
    app = FastAPI()
    ids = itertools.count(1)

    @app.post("/orders", status_code=201)
    async def order(item: dict[str, int]) -> dict[str, int]:
        return {"id": next(ids), **item}

    app.add_middleware(IdempotencyMiddleware, store=store)
    async with connect(app) as client:
        first = await client.post("/orders", json={"n": 1}, headers={"idempotency-key": '"o"'})
        again = await client.post("/orders", json={"n": 1}, headers={"idempotency-key": '"o"'})
        reused = await client.post("/orders", json={"n": 2}, headers={"idempotency-key": '"o"'})
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() == {"id": 1, "n": 1}
    assert reused.status_code == 422
