"""Pure request handling: the key, the caller's scope, stored headers.

The key follows draft-ietf-httpapi-idempotency-key-header: a Structured Field
String (``Idempotency-Key: "8e03978e-40d5"``). Many clients send the value
bare, so a bare token of safe characters (``BARE_KEY``: letters, digits and
``-._~+/=:``) is accepted too. Either way the key is 1 to 255 characters.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable

import http_sf

from headway._http import Scope, header

__all__ = [
    "BARE_KEY",
    "MAX_KEY_LENGTH",
    "REPLAY_DROPPED_HEADERS",
    "InvalidKey",
    "ScopeFunction",
    "by_credentials",
    "parse_key",
    "replay_headers",
    "storable_headers",
]

MAX_KEY_LENGTH = 255
BARE_KEY = re.compile(r"[A-Za-z0-9._~+/=:-]{1,255}")
#: A Structured Field String with no escapes and no parameters (the usual key): it is
#: read with this instead of the full parser, which costs more than the rest of a replay's
#: request handling together. Anything else still goes through http-sf.
_PLAIN_STRING = re.compile(rb'"([\x20\x21\x23-\x5b\x5d-\x7e]*)"')

#: Response headers never stored nor replayed: hop-by-hop (RFC 9110 7.6.1), ones
#: that describe one transmission (date, length, server), cookies (a replay must
#: not re-issue a session), and per-response rate-limit state.
REPLAY_DROPPED_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "date",
        "server",
        "set-cookie",
        "age",
        "via",
        "idempotent-replayed",
        "ratelimit",
        "ratelimit-policy",
        "retry-after",
    }
)

ScopeFunction = Callable[[Scope], str]


class InvalidKey(ValueError):
    """The Idempotency-Key header is malformed (the message says how)."""


def parse_key(values: list[bytes]) -> str:
    """The key from the header's values; ``InvalidKey`` if malformed (or repeated)."""
    if len(values) != 1:
        raise InvalidKey("send exactly one Idempotency-Key header")
    raw = values[0].strip(b" \t")
    plain = _PLAIN_STRING.fullmatch(raw)
    if plain is not None:
        key = plain.group(1).decode("ascii")
    elif raw.startswith(b'"'):
        try:
            item = http_sf.parse(raw, tltype="item")
        except Exception as exc:  # the parser's errors are not one class across versions
            raise InvalidKey("not a valid Structured Field String") from exc
        value = item[0] if isinstance(item, tuple) else item
        if not isinstance(value, str):
            raise InvalidKey("not a Structured Field String")
        key = value
    else:
        try:
            key = raw.decode("ascii")
        except UnicodeDecodeError:
            raise InvalidKey("a bare key must be ASCII") from None
        if not BARE_KEY.fullmatch(key):
            raise InvalidKey(
                "use a quoted Structured Field String, or 1-255 of A-Z a-z 0-9 - . _ ~ + / = :"
            )
    if not key:
        raise InvalidKey("the key is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"the key is longer than {MAX_KEY_LENGTH} characters")
    return key


def _sha256(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        # Length-prefixed, so no two different part lists hash alike.
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def by_credentials(scope: Scope) -> str:
    """The default caller scope: the ``Authorization`` header, else the client address.

    Only a hash is kept. Behind a proxy, anonymous callers share the proxy's
    address: give such apps a scope function (an account id, an API key).
    """
    credentials = header(scope, b"authorization")
    if credentials is not None:
        return "auth:" + _sha256(credentials)
    client = scope.get("client") or ("", 0)
    return "addr:" + _sha256(str(client[0]).encode())


def scope_id(caller: str) -> str:
    """The stored scope: a fixed-size hash of what the scope function returned."""
    return _sha256(caller.encode())


def storable_headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[tuple[str, str], ...]:
    """The response headers worth replaying, as latin-1 strings."""
    return tuple(
        (k.decode("latin-1").lower(), v.decode("latin-1"))
        for k, v in headers
        if k.decode("latin-1").lower() not in REPLAY_DROPPED_HEADERS
    )


def replay_headers(stored: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """Stored headers back as ASGI bytes, marked as a replay."""
    out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in stored]
    out.append((b"idempotent-replayed", b"true"))
    return out
