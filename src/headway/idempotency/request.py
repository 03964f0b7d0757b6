"""Pure request handling: the key, stored headers, and ``digest`` (the hash both the
caller's scope, ``callers``, and the fingerprint, ``fingerprints``, are made of).

The key follows draft-ietf-httpapi-idempotency-key-header: a Structured Field
String (``Idempotency-Key: "8e03978e-40d5"``). Many clients send the value
bare, so a bare token of safe characters (``BARE_KEY``: letters, digits and
``-._~+/=:``) is accepted too. Either way the key is 1 to 255 characters.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

import http_sf

__all__ = [
    "BARE_KEY",
    "MAX_KEY_LENGTH",
    "REPLAY_DROPPED_HEADERS",
    "InvalidKey",
    "digest",
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


def digest(*parts: bytes) -> str:
    """sha256 (hex) over ``parts``, each length-prefixed so no two part lists hash alike."""
    hashed = hashlib.sha256()
    for part in parts:
        hashed.update(len(part).to_bytes(8, "big"))
        hashed.update(part)
    return hashed.hexdigest()


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
