"""A small Starlette app whose side effects the idempotency tests count."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from headway import IdempotencyMiddleware


class Bank:
    """The side effects: every executed charge, and gates to hold a request in flight."""

    def __init__(self) -> None:
        self.charges: list[dict[str, Any]] = []
        self.ids = itertools.count(1)
        self.entered = asyncio.Event()
        self.proceed = asyncio.Event()
        self.proceed.set()


def make_app(bank: Bank, **options: Any) -> Starlette:
    async def pay(request: Request) -> Response:
        payload = await request.json()
        bank.entered.set()
        await bank.proceed.wait()
        charge = {"id": next(bank.ids), **payload}
        bank.charges.append(charge)
        return JSONResponse(charge, status_code=201, headers={"x-charge": str(charge["id"])})

    async def boom(request: Request) -> Response:
        bank.charges.append({"boom": True})
        raise RuntimeError("handler failed")

    async def fail(request: Request) -> Response:
        bank.charges.append({"fail": True})
        return JSONResponse({"error": "upstream"}, status_code=502)

    async def big(request: Request) -> Response:
        bank.charges.append({"big": True})

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(4):
                yield b"x" * 1000

        return StreamingResponse(chunks(), media_type="text/plain")

    routes = [
        Route("/payments", pay, methods=["POST", "PUT"]),
        Route("/boom", boom, methods=["POST"]),
        Route("/fail", fail, methods=["POST"]),
        Route("/big", big, methods=["POST"]),
    ]
    return Starlette(routes=routes, middleware=[Middleware(IdempotencyMiddleware, **options)])
