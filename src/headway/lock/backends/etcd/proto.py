"""etcd's v3 messages in protobuf, for the gRPC transport: only the fields the lock uses.

Written by hand from etcd's ``api/etcdserverpb/rpc.proto`` and ``api/mvccpb/kv.proto``
(field numbers and types, nothing else), so no generated stubs and no ``protobuf``
package: ``encode`` turns a request in the JSON gateway's shape (keys base64, 64-bit
integers as strings, enums by name) into protobuf bytes, ``decode`` a reply into that
same shape, so the backend builds and reads one shape for either transport. A field
the table does not know is skipped on decode, as protobuf does.
"""

from __future__ import annotations

import base64
from typing import Any

__all__ = ["Message", "decode", "encode"]

#: A field: (number, kind, the message or enum it holds). Kinds: "bytes" (base64 in
#: JSON), "int" (int64/uint64, a string in JSON), "bool", "enum", "string", "msg".
Field = tuple[int, str, Any]
Message = dict[str, Field]

_SORT_ORDER = ("NONE", "ASCEND", "DESCEND")
_SORT_TARGET = ("KEY", "VERSION", "CREATE", "MOD", "VALUE")
_COMPARE_RESULT = ("EQUAL", "GREATER", "LESS", "NOT_EQUAL")
_COMPARE_TARGET = ("VERSION", "CREATE", "MOD", "VALUE", "LEASE")
_FILTER = ("NOPUT", "NODELETE")
_EVENT = ("PUT", "DELETE")

HEADER: Message = {
    "cluster_id": (1, "int", None),
    "member_id": (2, "int", None),
    "revision": (3, "int", None),
    "raft_term": (4, "int", None),
}
KEY_VALUE: Message = {
    "key": (1, "bytes", None),
    "create_revision": (2, "int", None),
    "mod_revision": (3, "int", None),
    "version": (4, "int", None),
    "value": (5, "bytes", None),
    "lease": (6, "int", None),
}
RANGE: Message = {
    "key": (1, "bytes", None),
    "range_end": (2, "bytes", None),
    "limit": (3, "int", None),
    "revision": (4, "int", None),
    "sort_order": (5, "enum", _SORT_ORDER),
    "sort_target": (6, "enum", _SORT_TARGET),
    "serializable": (7, "bool", None),
    "keys_only": (8, "bool", None),
    "count_only": (9, "bool", None),
    "max_create_revision": (13, "int", None),
}
RANGE_REPLY: Message = {
    "header": (1, "msg", HEADER),
    "kvs": (2, "msgs", KEY_VALUE),
    "more": (3, "bool", None),
    "count": (4, "int", None),
}
PUT: Message = {
    "key": (1, "bytes", None),
    "value": (2, "bytes", None),
    "lease": (3, "int", None),
    "ignore_value": (5, "bool", None),
}
PUT_REPLY: Message = {"header": (1, "msg", HEADER)}
DELETE: Message = {"key": (1, "bytes", None), "range_end": (2, "bytes", None)}
DELETE_REPLY: Message = {"header": (1, "msg", HEADER), "deleted": (2, "int", None)}
COMPARE: Message = {
    "result": (1, "enum", _COMPARE_RESULT),
    "target": (2, "enum", _COMPARE_TARGET),
    "key": (3, "bytes", None),
    "version": (4, "int", None),
    "create_revision": (5, "int", None),
    "mod_revision": (6, "int", None),
    "value": (7, "bytes", None),
    "lease": (8, "int", None),
}
REQUEST_OP: Message = {
    "request_range": (1, "msg", RANGE),
    "request_put": (2, "msg", PUT),
    "request_delete_range": (3, "msg", DELETE),
}
RESPONSE_OP: Message = {
    "response_range": (1, "msg", RANGE_REPLY),
    "response_put": (2, "msg", PUT_REPLY),
    "response_delete_range": (3, "msg", DELETE_REPLY),
}
TXN: Message = {
    "compare": (1, "msgs", COMPARE),
    "success": (2, "msgs", REQUEST_OP),
    "failure": (3, "msgs", REQUEST_OP),
}
TXN_REPLY: Message = {
    "header": (1, "msg", HEADER),
    "succeeded": (2, "bool", None),
    "responses": (3, "msgs", RESPONSE_OP),
}
LEASE_GRANT: Message = {"TTL": (1, "int", None), "ID": (2, "int", None)}
LEASE_GRANT_REPLY: Message = {
    "header": (1, "msg", HEADER),
    "ID": (2, "int", None),
    "TTL": (3, "int", None),
    "error": (4, "string", None),
}
LEASE_ID: Message = {"ID": (1, "int", None)}  # revoke and keep-alive requests
LEASE_REPLY: Message = {
    "header": (1, "msg", HEADER),
    "ID": (2, "int", None),
    "TTL": (3, "int", None),
}
WATCH_CREATE: Message = {
    "key": (1, "bytes", None),
    "range_end": (2, "bytes", None),
    "start_revision": (3, "int", None),
    "filters": (5, "enums", _FILTER),
}
WATCH: Message = {"create_request": (1, "msg", WATCH_CREATE)}
EVENT: Message = {"type": (1, "enum", _EVENT), "kv": (2, "msg", KEY_VALUE)}
WATCH_REPLY: Message = {
    "header": (1, "msg", HEADER),
    "watch_id": (2, "int", None),
    "created": (3, "bool", None),
    "canceled": (4, "bool", None),
    "compact_revision": (5, "int", None),
    "cancel_reason": (6, "string", None),
    "events": (11, "msgs", EVENT),
}


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64s travel as ten-byte two's complement
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode(message: Message, data: dict[str, Any]) -> bytes:
    """``data`` (the gateway's JSON shape) as protobuf bytes of ``message``."""
    out = bytearray()
    for name, value in data.items():
        number, kind, sub = message[name]
        if kind in ("msgs", "enums"):
            for item in value:
                out += _field(number, kind[:-1], sub, item)
        else:
            out += _field(number, kind, sub, value)
    return bytes(out)


def _field(number: int, kind: str, sub: Any, value: Any) -> bytes:
    if kind == "msg":
        body = encode(sub, value)
    elif kind in ("bytes", "string"):
        body = base64.b64decode(value) if kind == "bytes" else str(value).encode()
    else:  # a varint
        n = sub.index(value) if kind == "enum" else int(value)
        return _varint(number << 3) + _varint(n)
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def decode(message: Message, data: bytes) -> dict[str, Any]:
    """Protobuf bytes of ``message`` in the gateway's JSON shape."""
    by_number = {number: (name, kind, sub) for name, (number, kind, sub) in message.items()}
    out: dict[str, Any] = {}
    i, end = 0, len(data)
    while i < end:
        tag, i = _read_varint(data, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            raw, i = _read_varint(data, i)
            value: Any = raw
        elif wire == 2:
            size, i = _read_varint(data, i)
            value, i = data[i : i + size], i + size
        else:  # fixed 32/64 bits: no field the lock reads
            i += 4 if wire == 5 else 8
            continue
        if number not in by_number:
            continue
        name, kind, sub = by_number[number]
        if kind in ("msgs", "enums"):
            out.setdefault(name, []).extend(_values(kind[:-1], sub, value, wire))
        else:
            out[name] = _values(kind, sub, value, wire)[0]
    return out


def _values(kind: str, sub: Any, value: Any, wire: int) -> list[Any]:
    if kind == "msg":
        return [decode(sub, value)]
    if kind == "bytes":
        return [base64.b64encode(value).decode()]
    if kind == "string":
        return [bytes(value).decode()]
    if wire == 2:  # packed varints (repeated enums)
        numbers, j = [], 0
        while j < len(value):
            n, j = _read_varint(value, j)
            numbers.append(n)
    else:
        numbers = [value]
    if kind == "enum":
        return [sub[n] if n < len(sub) else str(n) for n in numbers]
    if kind == "bool":
        return [bool(n) for n in numbers]
    return [str(n - (1 << 64) if n >= 1 << 63 else n) for n in numbers]


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        byte = data[i]
        i += 1
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            return n, i
        shift += 7
