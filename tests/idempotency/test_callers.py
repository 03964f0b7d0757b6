"""A stored response goes only to the caller who stored it, on every database, with the
Redis lock: cookie sessions behind one proxy address, bearer tokens, API keys,
anonymous callers, and scope functions that return None, are async, or fail."""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from redis import asyncio as aioredis
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway import (
    ApiKey,
    AuthenticatedUser,
    ClientAddress,
    IdempotencyMiddleware,
    RecordStore,
    RedisLockBackend,
    SessionCookie,
)
from headway._http import Scope

pytestmark = pytest.mark.anyio

PROXY = ("10.0.0.1", 40000)  # every request arrives from the reverse proxy's address
BODY = {"amount": 100}


@dataclass
class Payments:
    """A cookie-session app: ``/login`` issues ``sid``; ``/pay`` charges its account."""

    sessions: dict[str, str] = field(default_factory=dict)  # sid -> account
    charges: list[tuple[str, int]] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def app(self, **options: Any) -> Starlette:
        async def login(request: Request) -> Response:
            sid = secrets.token_urlsafe(16)
            self.sessions[sid] = request.query_params["account"]
            response = JSONResponse({"ok": True})
            response.set_cookie("sid", sid)
            return response

        async def pay(request: Request) -> Response:
            account = self.sessions.get(request.cookies.get("sid", ""))
            if account is None:
                return JSONResponse({"error": "log in"}, status_code=401)
            payload = await request.json()
            charge = next(self.ids)
            self.charges.append((account, charge))
            body = {"charge": charge, "account": account, **payload}
            return JSONResponse(body, status_code=201)

        routes = [Route("/login", login, methods=["POST"]), Route("/pay", pay, methods=["POST"])]
        middleware = [Middleware(IdempotencyMiddleware, **options)]
        return Starlette(routes=routes, middleware=middleware)


@pytest.fixture
async def redis_lock(redis_client: aioredis.Redis) -> RedisLockBackend:
    return RedisLockBackend(redis_client)


@pytest.fixture
def payments() -> Payments:
    return Payments()


@pytest.fixture
def serve(
    payments: Payments, store: RecordStore, redis_lock: RedisLockBackend
) -> Callable[..., httpx.AsyncClient]:
    """A client of the app behind the proxy; each client keeps its own cookies."""

    def client(**options: Any) -> httpx.AsyncClient:
        app = payments.app(store=store, lock_backend=redis_lock, **options)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False, client=PROXY)
        return httpx.AsyncClient(transport=transport, base_url="http://shop")

    return client


async def logged_in(client: httpx.AsyncClient, account: str) -> httpx.AsyncClient:
    assert (await client.post("/login", params={"account": account})).status_code == 200
    return client


async def pay(client: httpx.AsyncClient, key: str, **headers: str) -> httpx.Response:
    return await client.post("/pay", json=BODY, headers={"idempotency-key": key, **headers})


def problem(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/problem+json"
    return str(response.json()["type"]).rsplit("/", 1)[1]


async def test_named_session_cookie_callers_get_their_own_executions(
    serve: Callable[..., httpx.AsyncClient], payments: Payments
) -> None:
    """Two session holders and an anonymous caller use the guessable key ``order-1``."""
    options = {"scope_function": SessionCookie("sid")}
    async with serve(**options) as a, serve(**options) as b, serve(**options) as anonymous:
        await logged_in(a, "ACC-A")
        await logged_in(b, "ACC-B")
        a1 = await pay(a, "order-1")
        b1 = await pay(b, "order-1")  # B's own execution: it never learns A used the key
        a2 = await pay(a, "order-1")
        b2 = await pay(b, "order-1")
        anon1 = await pay(anonymous, "order-1")
        anon2 = await pay(anonymous, "order-1")
        b_other = await client_reuse(b)
    assert (a1.status_code, b1.status_code) == (201, 201)
    assert a1.json()["account"] == "ACC-A"
    assert b1.json()["account"] == "ACC-B"
    assert "idempotent-replayed" not in b1.headers
    assert a2.json() == a1.json()
    assert a2.headers["idempotent-replayed"] == "true"
    assert b2.json() == b1.json()
    assert b2.headers["idempotent-replayed"] == "true"
    # Anonymous: its 401 runs once; the retry is a conflict, nobody's response.
    assert anon1.status_code == 401
    assert (anon2.status_code, problem(anon2)) == (409, "idempotency-key-unverified")
    assert b_other.status_code == 422  # B's own record, another body
    assert payments.charges == [("ACC-A", 1), ("ACC-B", 2)]


async def client_reuse(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post("/pay", json={"amount": 1}, headers={"idempotency-key": "order-1"})


async def test_default_scope_fails_closed_for_cookie_sessions(
    serve: Callable[..., httpx.AsyncClient], payments: Payments
) -> None:
    """On defaults a cookie names nobody: nothing is replayed, nothing runs twice."""
    async with serve() as a, serve() as b, serve() as anonymous:
        await logged_in(a, "ACC-A")
        await logged_in(b, "ACC-B")
        a1 = await pay(a, "pay-001")
        b_same = await pay(b, "pay-001")
        b_other = await client_reuse_key(b, "pay-001")
        anon = await pay(anonymous, "pay-001")
        a_retry = await pay(a, "pay-001")
    assert a1.status_code == 201
    assert a1.json()["account"] == "ACC-A"
    for answer in (b_same, b_other, anon, a_retry):
        assert (answer.status_code, problem(answer)) == (409, "idempotency-key-unverified")
        assert "ACC-A" not in answer.text
        assert "charge" not in answer.json()
    assert payments.charges == [("ACC-A", 1)]


async def client_reuse_key(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.post("/pay", json={"amount": 7}, headers={"idempotency-key": key})


@pytest.mark.parametrize(
    ("scope_function", "credential"),
    [
        (None, "authorization"),  # the default: a hash of the Authorization header
        (ApiKey("x-api-key"), "x-api-key"),
    ],
    ids=["bearer", "api-key"],
)
async def test_credential_callers_are_isolated_and_replayed(
    serve: Callable[..., httpx.AsyncClient],
    payments: Payments,
    scope_function: Any,
    credential: str,
) -> None:
    options = {} if scope_function is None else {"scope_function": scope_function}
    async with serve(**options) as a, serve(**options) as b, serve(**options) as nobody:
        await logged_in(a, "ACC-A")
        await logged_in(b, "ACC-B")
        a1 = await pay(a, "order-1", **{credential: "Bearer token-a"})
        b1 = await pay(b, "order-1", **{credential: "Bearer token-b"})
        a2 = await pay(a, "order-1", **{credential: "Bearer token-a"})
        b2 = await pay(b, "order-1", **{credential: "Bearer token-b"})
        # Without the credential the caller is unnamed: its 401 runs once, then 409.
        none1 = await pay(nobody, "order-1")
        none2 = await pay(nobody, "order-1")
    assert a1.json()["account"] == "ACC-A"
    assert b1.json()["account"] == "ACC-B"
    assert a2.json() == a1.json()
    assert b2.json() == b1.json()
    assert a2.headers["idempotent-replayed"] == b2.headers["idempotent-replayed"] == "true"
    assert (none1.status_code, none2.status_code) == (401, 409)
    assert payments.charges == [("ACC-A", 1), ("ACC-B", 2)]


async def async_scope(scope: Scope) -> str | None:
    return SessionCookie("sid")(scope)


def failing_scope(scope: Scope) -> str | None:
    raise RuntimeError("the scope function's own bug")


def wrong_type_scope(scope: Scope) -> Any:
    return 42


async def test_async_scope_function_names_callers(
    serve: Callable[..., httpx.AsyncClient], payments: Payments
) -> None:
    async with serve(scope_function=async_scope) as a, serve(scope_function=async_scope) as b:
        await logged_in(a, "ACC-A")
        await logged_in(b, "ACC-B")
        a1, b1, a2 = await pay(a, "k"), await pay(b, "k"), await pay(a, "k")
    assert (a1.json()["account"], b1.json()["account"]) == ("ACC-A", "ACC-B")
    assert a2.json() == a1.json()
    assert a2.headers["idempotent-replayed"] == "true"
    assert len(payments.charges) == 2


@pytest.mark.parametrize("scope_function", [failing_scope, wrong_type_scope])
async def test_a_broken_scope_function_fails_closed_and_is_logged(
    serve: Callable[..., httpx.AsyncClient],
    payments: Payments,
    scope_function: Callable[[Scope], Awaitable[str | None] | str | None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "headway.idempotency"):
        async with (
            serve(scope_function=scope_function) as a,
            serve(scope_function=scope_function) as b,
        ):
            await logged_in(a, "ACC-A")
            await logged_in(b, "ACC-B")
            first, other = await pay(a, "k"), await pay(b, "k")
    assert first.status_code == 201
    assert (other.status_code, problem(other)) == (409, "idempotency-key-unverified")
    assert len(payments.charges) == 1
    assert any("scope function" in r.getMessage() for r in caplog.records)
    # The once-per-middleware advice names the option to set.
    assert sum("scope_function=" in r.getMessage() for r in caplog.records) == 2  # a, b


async def test_trusted_proxy_address_as_scope(
    serve: Callable[..., httpx.AsyncClient], payments: Payments
) -> None:
    """``ClientAddress`` with the proxy trusted names callers by their forwarded address."""
    scope_function = ClientAddress(trusted_proxies=["10.0.0.0/8"])
    async with serve(scope_function=scope_function) as a, serve(scope_function=scope_function) as b:
        await logged_in(a, "ACC-A")
        await logged_in(b, "ACC-B")
        a1 = await pay(a, "k", **{"x-forwarded-for": "198.51.100.7"})
        b1 = await pay(b, "k", **{"x-forwarded-for": "203.0.113.9"})
        a2 = await pay(a, "k", **{"x-forwarded-for": "198.51.100.7"})
    assert (a1.json()["account"], b1.json()["account"]) == ("ACC-A", "ACC-B")
    assert a2.json() == a1.json()


def test_session_cookie_reads_one_named_cookie() -> None:
    sid = SessionCookie("sid")

    def scope(*cookies: bytes) -> Scope:
        return {"type": "http", "headers": [(b"cookie", c) for c in cookies]}

    named = sid(scope(b"theme=dark; sid=abc"))
    assert named is not None
    assert named.startswith("session@")
    assert "abc" not in named
    assert sid(scope(b"theme=dark", b"sid=abc")) == named  # HTTP/2 sends several fields
    assert sid(scope(b"sid=abc; theme=light")) == named  # other cookies do not matter
    assert sid(scope(b"sid=abd")) != named
    assert sid(scope(b"xsid=abc; theme=dark")) is None
    assert sid(scope(b"sid=")) is None
    assert sid(scope()) is None
    with pytest.raises(ValueError, match="cookie name"):
        SessionCookie("a=b")


class HeaderUser(AuthenticationBackend):
    """Authenticates ``x-user`` (the app's own login, mounted outside the middleware)."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        name = conn.headers.get("x-user")
        return None if name is None else (AuthCredentials(["authenticated"]), SimpleUser(name))


async def test_authenticated_user_as_scope(
    payments: Payments, store: RecordStore, redis_lock: RedisLockBackend
) -> None:
    inner = payments.app(store=store, lock_backend=redis_lock, scope_function=AuthenticatedUser())
    app = AuthenticationMiddleware(inner, backend=HeaderUser())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False, client=PROXY)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://shop") as a,
        httpx.AsyncClient(transport=transport, base_url="http://shop") as b,
    ):
        await logged_in(a, "ACC-A")
        await logged_in(b, "ACC-B")
        a1 = await pay(a, "k", **{"x-user": "alice"})
        b1 = await pay(b, "k", **{"x-user": "bob"})
        a2 = await pay(a, "k", **{"x-user": "alice"})
        anonymous = await pay(b, "k")  # AuthenticatedUser() is None: unnamed, first use runs
    assert (a1.json()["account"], b1.json()["account"]) == ("ACC-A", "ACC-B")
    assert a2.json() == a1.json()
    assert anonymous.status_code == 201
    assert len(payments.charges) == 3
