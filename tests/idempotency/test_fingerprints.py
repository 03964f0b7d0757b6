"""``default_fingerprint`` and ``fingerprint_fields``: what counts as the same request;
then the ``fingerprint`` option through the middleware, on each database."""

import json
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway import (
    FingerprintFunction,
    IdempotencyMiddleware,
    MemoryLockBackend,
    RecordStore,
    default_fingerprint,
    fingerprint_fields,
)
from headway._http import Scope
from headway.idempotency.callers import caller_id
from headway.idempotency.fingerprints import earlier_fingerprint
from headway.idempotency.record import StoredResponse
from headway.idempotency.request import digest

from .apps import Bank, make_app
from .test_middleware import connect, rows

JSON = "application/json"


def scope(
    content_type: str | None = JSON,
    method: str = "POST",
    path: str = "/payments",
    query: bytes = b"",
) -> dict[str, Any]:
    headers = [] if content_type is None else [(b"content-type", content_type.encode())]
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": headers,
    }


def same(a: bytes, b: bytes, content_type: str | None = JSON) -> bool:
    return default_fingerprint(scope(content_type), a) == default_fingerprint(
        scope(content_type), b
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (b'{"amount": 10, "currency": "EUR"}', b'{"currency":"EUR","amount":10}'),
        (b'{"a": {"y": 1, "x": [1, 2]}}', b'\n{ "a" : { "x" : [ 1 ,2 ], "y":1 } }\r\n\t'),
        (b'{"name": "\\u00e9"}', '{"name": "é"}'.encode()),  # escapes resolved
        (b'{"v": 1.0}', b'{"v": 1.00}'),  # the same double
        (b'{"v": 0.5}', b'{"v": 5e-1}'),
        (b'{"s": "\\ud800", "t": 1}', b'{"t":1,"s":"\\ud800"}'),  # a lone surrogate
        (b"[1, 2]", b"[1,2]"),  # any JSON value, not only objects
    ],
)
def test_json_is_compared_as_data(a: bytes, b: bytes) -> None:
    assert same(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (b'{"amount": 10}', b'{"amount": 11}'),
        (b'{"v": 1}', b'{"v": 1.0}'),  # int and float stay distinct
        (b"[1, 2]", b"[2, 1]"),  # arrays keep their order
        (b'{"v": null}', b"{}"),
        (b'{"v": "1"}', b'{"v": 1}'),
    ],
)
def test_different_json_differs(a: bytes, b: bytes) -> None:
    assert not same(a, b)


def test_json_media_type_ignores_parameters_and_case() -> None:
    body, reordered = b'{"a": 1, "b": 2}', b'{"b":2,"a":1}'
    first = default_fingerprint(scope(JSON), body)
    for content_type in ["application/json; charset=utf-8", "Application/JSON ;charset=UTF-8"]:
        assert default_fingerprint(scope(content_type), reordered) == first
    vendor = "application/vnd.bank.payment+json"
    assert default_fingerprint(scope(vendor), body) == default_fingerprint(scope(vendor), reordered)
    assert default_fingerprint(scope(vendor), body) != first  # another media type


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_other_bodies_are_compared_as_bytes(content_type: str | None) -> None:
    assert same(b'{"a": 1}', b'{"a": 1}', content_type)
    assert not same(b'{"a": 1, "b": 2}', b'{"b":2,"a":1}', content_type)


def test_method_path_query_and_content_type_count() -> None:
    body = b'{"a": 1}'
    base = default_fingerprint(scope(), body)
    assert default_fingerprint(scope(method="PATCH"), body) != base
    assert default_fingerprint(scope(path="/refunds"), body) != base
    assert default_fingerprint(scope(query=b"dry_run=1"), body) != base
    assert default_fingerprint(scope("text/plain"), body) != base
    charset = "text/plain; charset=latin-1"
    assert default_fingerprint(scope(charset), body) != default_fingerprint(
        scope("text/plain"), body
    )


DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE_INT = b'{"n": ' + b"7" * 5000 + b"}"
#: JSON bodies with no canonical form: each is compared byte for byte, so the second
#: (the same data to a naive canonicaliser, or just re-spaced) is a different request.
UNPARSEABLE = [
    pytest.param(DEEP, DEEP + b" ", id="nesting-100k"),
    pytest.param(b'{"a": "\xff"}', b'{"a":"\xff"}', id="invalid-utf8"),
    pytest.param(b'{"a": 1e999}', b'{"a": 2e999}', id="1e999"),
    pytest.param(HUGE_INT, HUGE_INT.replace(b" ", b""), id="5000-digit-int"),
    pytest.param(b'{"a": 1, "a": 2}', b'{"a": 2}', id="duplicate-key"),
    pytest.param(b'{"a": NaN}', b'{"a":NaN}', id="nan"),
    pytest.param(b'\xef\xbb\xbf{"a": 1}', b'\xef\xbb\xbf{"a":1}', id="bom"),
    pytest.param(b"", b" ", id="empty"),
]


@pytest.mark.parametrize(("body", "variant"), UNPARSEABLE)
def test_unparseable_json_falls_back_to_bytes(body: bytes, variant: bytes) -> None:
    assert same(body, body)
    assert not same(body, variant)


def test_fields_pick_what_counts() -> None:
    by_fields = fingerprint_fields("amount", "currency", "customer.id")

    def fp(body: bytes, **where: Any) -> str:
        return by_fields(scope(**where), body)  # type: ignore[return-value]

    base = fp(b'{"amount": 10, "currency": "EUR", "customer": {"id": 7}, "note": "a"}')
    respaced = b'{"note":"b","customer":{"name":"x","id":7},"currency":"EUR","amount":10}'
    assert fp(respaced) == base  # the note and the customer's name do not count
    assert fp(respaced, content_type="text/plain") == base  # the content type does not either
    assert fp(respaced, query=b"trace=1") == base  # nor the query string
    assert fp(b'{"amount": 11, "currency": "EUR", "customer": {"id": 7}}') != base
    assert fp(b'{"amount": 10, "currency": "EUR", "customer": {"id": 8}}') != base
    assert fp(respaced, method="PATCH") != base
    assert fp(respaced, path="/refunds") != base


def test_fields_absent_differs_from_null() -> None:
    by_fields = fingerprint_fields("amount", "customer.id")
    absent = by_fields(scope(), b'{"amount": 1}')
    assert by_fields(scope(), b'{"amount": 1, "customer": {}}') == absent
    assert by_fields(scope(), b'{"amount": 1, "customer": 5}') == absent  # not an object
    assert by_fields(scope(), b'{"amount": 1, "customer": null}') == absent
    assert by_fields(scope(), b'{"amount": 1, "customer": {"id": null}}') != absent
    assert by_fields(scope(), b'{"amount": null}') != by_fields(scope(), b"{}")


def test_fields_of_a_body_that_is_no_json_object_fingerprint_it_whole() -> None:
    by_fields = fingerprint_fields("amount")
    for body in [b"[1, 2]", b"amount=10", b'{"amount": 1e999}', DEEP]:
        assert by_fields(scope(), body) == default_fingerprint(scope(), body)


@pytest.mark.parametrize("fields", [(), ("",), ("a..b",), ("a.",)])
def test_fields_must_name_something(fields: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="field"):
        fingerprint_fields(*fields)


# Through the middleware, on each database.

KEY = {"authorization": "Bearer alice", "idempotency-key": '"pay-1"', "content-type": JSON}


def raw_app(bank: Bank, **options: Any) -> Starlette:
    """An endpoint that never parses the body, so what a fingerprint makes of it shows."""

    async def take(request: Request) -> Response:
        bank.charges.append({"bytes": len(await request.body())})
        return JSONResponse({"id": len(bank.charges)}, status_code=201)

    routes = [Route("/raw", take, methods=["POST"])]
    return Starlette(routes=routes, middleware=[Middleware(IdempotencyMiddleware, **options)])


async def post(app: Starlette, *bodies: bytes, path: str = "/payments") -> list[httpx.Response]:
    async with connect(app) as client:
        return [await client.post(path, content=body, headers=KEY) for body in bodies]


def replayed(response: httpx.Response) -> bool:
    return bool(response.headers.get("idempotent-replayed", "") == "true")


@pytest.mark.anyio
async def test_a_reordered_respaced_retry_is_a_replay(store: RecordStore) -> None:
    bank = Bank()
    app = make_app(bank, store=store, lock_backend=MemoryLockBackend())
    first, retry, other = await post(
        app,
        b'{"amount": 10, "currency": "EUR"}',
        b'{\n  "currency": "EUR",\n  "amount": 10\n}',
        b'{"amount": 11, "currency": "EUR"}',
    )
    assert first.status_code == retry.status_code == 201
    assert replayed(retry)
    assert retry.json() == first.json()
    assert other.status_code == 422
    assert len(bank.charges) == 1


@pytest.mark.anyio
async def test_a_record_stored_before_the_upgrade_still_replays(store: RecordStore) -> None:
    """Records written by 0.1.0 hold a byte-for-byte fingerprint: the same bytes replay."""
    body = b'{"amount": 10, "currency": "EUR"}'
    caller = caller_id("auth:" + digest(b"Bearer alice"))  # by_credentials, as 0.1.0 stored it
    http = {"method": "POST", "path": "/payments", "raw_path": b"/payments", "query_string": b""}
    old = earlier_fingerprint({**http, "headers": [(b"content-type", JSON.encode())]}, body)
    await store.claim(caller, "pay-1", old, fence=7, lease_token="t", lease_ttl=30)
    stored = StoredResponse(201, (("content-type", "application/json"),), b'{"id": 99}')
    assert await store.complete(caller, "pay-1", 7, stored)
    bank = Bank()
    app = make_app(bank, store=store, lock_backend=MemoryLockBackend())
    retry, reordered = await post(app, body, b'{"currency": "EUR", "amount": 10}')
    assert retry.status_code == 201
    assert replayed(retry)
    assert retry.json() == {"id": 99}
    assert reordered.status_code == 422  # 0.1.0 compared bytes: only the same bytes match
    assert bank.charges == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    "fingerprint",
    [
        pytest.param(fingerprint_fields("amount", "currency"), id="fields"),
        pytest.param(
            lambda scope, body: default_fingerprint(scope, _without_note(body)), id="custom"
        ),
    ],
)
async def test_a_fingerprint_that_ignores_a_field(
    store: RecordStore, fingerprint: FingerprintFunction
) -> None:
    bank = Bank()
    app = make_app(bank, store=store, lock_backend=MemoryLockBackend(), fingerprint=fingerprint)
    first, retry, other = await post(
        app,
        b'{"amount": 10, "currency": "EUR", "note": "first try"}',
        b'{"amount": 10, "currency": "EUR", "note": "second try"}',
        b'{"amount": 12, "currency": "EUR", "note": "first try"}',
    )
    assert first.status_code == 201
    assert replayed(retry)
    assert retry.json() == first.json()
    assert other.status_code == 422
    assert len(bank.charges) == 1


def _without_note(body: bytes) -> bytes:
    payload = json.loads(body)
    del payload["note"]
    return json.dumps(payload).encode()


def _raises(scope: Scope, body: bytes) -> str:
    raise KeyError("note")


@pytest.mark.anyio
@pytest.mark.parametrize("fingerprint", [_raises, lambda scope, body: None])
async def test_a_failing_fingerprint_is_a_500_problem_and_nothing_runs(
    store: RecordStore, fingerprint: Any, caplog: pytest.LogCaptureFixture
) -> None:
    bank = Bank()
    app = make_app(bank, store=store, lock_backend=MemoryLockBackend(), fingerprint=fingerprint)
    (response,) = await post(app, b'{"amount": 10}')
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"].endswith("/idempotency-fingerprint-failed")
    assert bank.charges == []
    assert await rows(store) == []
    (record,) = [r for r in caplog.records if r.name == "headway.idempotency"]
    assert record.exc_info is not None


@pytest.mark.anyio
@pytest.mark.parametrize(("body", "variant"), UNPARSEABLE)
async def test_unparseable_json_is_compared_as_bytes_never_a_500(
    store: RecordStore, body: bytes, variant: bytes
) -> None:
    bank = Bank()
    app = raw_app(bank, store=store, lock_backend=MemoryLockBackend())
    first, retry, other = await post(app, body, body, variant, path="/raw")
    assert first.status_code == retry.status_code == 201
    assert replayed(retry)
    assert other.status_code == 422
    assert len(bank.charges) == 1
