"""Request fingerprints: when a retry with the same Idempotency-Key is the same request.

``IdempotencyMiddleware(fingerprint=...)`` takes a ``FingerprintFunction``: called with
the ASGI scope and the whole request body, it returns ``str`` or ``bytes``, and the
record keeps the sha256 of that. Equal results are the same request (a replay);
different ones a reused key (422).

``default_fingerprint`` covers the method, the raw path, the query string, the content
type and the body. A body whose content type is JSON (``application/json`` or
``application/*+json``; parameters such as ``charset`` ignored, JSON being UTF-8) is
compared as data: keys sorted, insignificant whitespace gone, escapes resolved
(``"\\u00e9"`` is ``"é"``). Numbers are compared as Python reads them: integers exactly,
others as doubles, so ``1`` and ``1.0`` differ while ``1.0`` and ``1.00`` do not. A body
that cannot be compared as data — not UTF-8, a duplicate key (parsers disagree on which
one wins), ``NaN``/``Infinity``, a number out of a double's range (``1e999``), an integer
over Python's digit limit, nesting deeper than the parser goes — is compared byte for
byte with its content type as sent, as every other body is; it never fails the request.
``fingerprint_fields`` makes a fingerprint of a few JSON fields.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any

from headway._http import Scope, Send, header_values, send_problem
from headway.idempotency.request import digest

__all__ = [
    "FingerprintFunction",
    "default_fingerprint",
    "fingerprint_fields",
    "request_fingerprint",
]

log = logging.getLogger("headway.idempotency")

FingerprintFunction = Callable[[Scope, bytes], str | bytes]
"""``(scope, body) -> str | bytes``; the record keeps the sha256 of what it returns. Called
in the event loop for every request with a key, before the record is looked up: keep
it a pure function of the request (no I/O: a retry must get the same answer)."""

_NOT_JSON: Any = object()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        # Python keeps the last duplicate, other parsers the first: no one meaning to compare.
        raise ValueError("duplicate key")
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)
# ASCII out: lone surrogates (``"\ud800"``) stay escapes instead of failing to encode.
# Parsed JSON has no cycles: skipping the check saves ~10% (benchmarks/fingerprint_cost.py).
_ENCODER = json.JSONEncoder(
    ensure_ascii=True, check_circular=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)


def _parse(body: bytes) -> Any:
    """The JSON value in ``body``, or ``_NOT_JSON`` if it has none that compares as data."""
    try:
        return _DECODER.decode(body.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and the digit limit included
        return _NOT_JSON


def _canonical(value: Any) -> bytes | None:
    """``value`` as canonical JSON; None if it has none.

    ``NaN``, ``Infinity`` and ``1e999`` (read as infinity, as ``2e999`` is) parse, but are
    not JSON numbers: ``allow_nan=False`` refuses them here.
    """
    try:
        return _ENCODER.encode(value).encode("ascii")
    except (ValueError, RecursionError):
        return None


def _json_media_type(content_type: list[bytes]) -> bytes | None:
    """The lower-cased media type when the one Content-Type header is JSON, else None."""
    if len(content_type) != 1:
        return None
    essence = content_type[0].split(b";", 1)[0].strip(b" \t").lower()
    if essence == b"application/json" or (
        essence.startswith(b"application/") and essence.endswith(b"+json")
    ):
        return essence
    return None


def _route(scope: Scope) -> tuple[bytes, bytes]:
    return scope["method"].encode(), scope.get("raw_path") or scope["path"].encode()


def default_fingerprint(scope: Scope, body: bytes) -> str:
    """Method, raw path, query string, content type and body; a JSON body as data.

    See the module's docstring for what counts as the same JSON. A wrapper can change the
    body first or add to the result: ``default_fingerprint(scope, drop_nonce(body))``.

    Args:
        scope: The request's ASGI scope.
        body: The whole request body.
    """
    method, path = _route(scope)
    query = scope.get("query_string", b"")
    content_type = header_values(scope, b"content-type")
    media_type = _json_media_type(content_type)
    if media_type is not None:
        value = _parse(body)
        canonical = None if value is _NOT_JSON else _canonical(value)
        if canonical is not None:
            return digest(b"json", method, path, query, media_type, canonical)
    return digest(b"raw", method, path, query, b",".join(content_type), body)


def earlier_fingerprint(scope: Scope, body: bytes) -> str:
    """The fingerprint headway stored before JSON bodies were compared as data (byte for
    byte, 0.1.0). A retry of a record written then still matches it, so an upgrade never
    turns a retry into a 422. Delete once every such record has expired (one ``ttl``)."""
    method, path = _route(scope)
    content_type = b",".join(header_values(scope, b"content-type"))
    return digest(method, path, scope.get("query_string", b""), content_type, body)


def _pick(obj: dict[str, Any], path: list[str]) -> list[Any]:
    """``[value]`` at ``path``, ``[]`` if absent (so an absent field differs from null)."""
    value: Any = obj
    for name in path:
        if not isinstance(value, dict) or name not in value:
            return []
        value = value[name]
    return [value]


def fingerprint_fields(*fields: str) -> FingerprintFunction:
    """A fingerprint of the method, the raw path and these fields of a JSON object body.

    Each field is a top-level key or a dotted path through objects (``"customer.id"``);
    a missing one (or a path through a non-object) is absent, which differs from null.
    Values compare as ``default_fingerprint`` compares JSON. The query string, the content
    type and every other field are left out. A body that is not a JSON object (whatever
    its content type says) is fingerprinted whole, by ``default_fingerprint``.

    Args:
        *fields: The fields compared (at least one): top-level keys or dotted paths.

    Raises:
        ValueError: No field, or an empty one (or an empty part of a path).
    """
    if not fields:
        raise ValueError("fingerprint_fields needs at least one field")
    paths = [(field, field.split(".")) for field in fields]
    for field, path in paths:
        if not all(path):
            raise ValueError(f"{field!r} is not a field name or a dotted path")

    def by_fields(scope: Scope, body: bytes) -> str:
        value = _parse(body)
        if isinstance(value, dict):
            canonical = _canonical([[field, *_pick(value, path)] for field, path in paths])
            if canonical is not None:
                return digest(b"fields", *_route(scope), canonical)
        return default_fingerprint(scope, body)

    by_fields.__qualname__ = f"fingerprint_fields({', '.join(map(repr, fields))})"
    return by_fields


def _as_bytes(result: object) -> bytes:
    if isinstance(result, str):
        return result.encode()  # UnicodeEncodeError on a lone surrogate: a failure too
    if isinstance(result, bytes):
        return result
    raise TypeError(f"a fingerprint must be str or bytes, not {type(result).__name__}")


async def request_fingerprint(
    function: FingerprintFunction, scope: Scope, body: bytes, send: Send
) -> str | None:
    """The stored fingerprint: sha256 of what ``function`` returns.

    If it raises (or returns neither str nor bytes) that is the app's bug, not the
    client's: it is logged with its traceback, the client gets a 500 problem
    (``idempotency-fingerprint-failed``), nothing is recorded, and this returns None.
    """
    try:
        data = _as_bytes(function(scope, body))
    except Exception:
        log.exception("the idempotency fingerprint function %r failed; answered 500", function)
        await send_problem(
            send, 500, "idempotency-fingerprint-failed", "Internal Server Error",
            "The server could not fingerprint this request; nothing was done.",
        )  # fmt: skip
        return None
    return hashlib.sha256(data).hexdigest()
