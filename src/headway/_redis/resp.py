"""What headway's async and sync connections share: RESP requests, error replies, the fallback.

A script call is an ``FCALL`` (or ``EVALSHA``, ``EVAL``: ``_redis.scripts``) written as
one RESP array: ``REQUEST % (elements, script head, tail)``. The script's head
(``Script.head``) is packed once per script and way of sending; the tail
(the key count, the keys, the arguments) once per call, by ``tail``, unless the
caller packed keys or arguments that many calls share with ``pack_keys`` /
``pack``. Values are encoded as redis-py's encoder encodes them.

A client whose connections cannot be taken over sends every call through
redis-py (``refused`` says so once); redis-py takes the arguments unpacked
(``unpacked``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from redis import exceptions as redis_errors

__all__ = [
    "REQUEST",
    "Arg",
    "Packed",
    "bulk",
    "pack",
    "pack_keys",
    "refused",
    "reply_error",
    "tail",
    "unpacked",
]

log = logging.getLogger("headway")

#: What a script call's keys and arguments may be (encoded as redis-py encodes them).
Arg = str | int | float | bytes

#: One request: ``REQUEST % (elements, head, tail)``, ``elements`` as ``tail`` counts them.
REQUEST = b"*%d\r\n%b%b"

try:  # redis-py's own mapping of error replies to exception classes (NOSCRIPT, READONLY, ...)
    from redis._parsers.base import BaseParser

    reply_error: Callable[[str], Exception] = BaseParser.parse_error
except ImportError:  # pragma: no cover - a redis-py without it: one class for all
    reply_error = redis_errors.ResponseError


def bulk(value: Arg) -> bytes:
    """``value`` as a RESP bulk string, encoded as redis-py's encoder encodes it."""
    # str as UTF-8, numbers by repr, bytes as they are.
    data: bytes
    if isinstance(value, str):
        data = value.encode()
    elif type(value) is int:  # not bool, a subclass of int that redis-py refuses
        data = b"%d" % value
    elif isinstance(value, bool):
        raise redis_errors.DataError(
            "Invalid input of type: 'bool'. Convert to a bytes, string, int or float first."
        )
    elif isinstance(value, bytes):
        data = value
    else:
        data = repr(value).encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


class Packed(NamedTuple):
    """Arguments packed once by ``pack`` and reused for many calls."""

    values: tuple[Arg, ...]
    data: bytes


def pack(args: Sequence[Arg]) -> Packed:
    """Pack script arguments that many calls share (they cost nothing per call then)."""
    return Packed(tuple(args), b"".join(map(bulk, args)))


def unpacked(args: Sequence[Arg] | Packed) -> Sequence[Arg]:
    """The arguments as redis-py takes them."""
    return args.values if isinstance(args, Packed) else args


@functools.lru_cache(maxsize=4096)
def _packed_keys(keys: tuple[str, ...]) -> bytes:
    return b"".join([bulk(len(keys)), *map(bulk, keys)])


def pack_keys(keys: Sequence[str]) -> Packed:
    """Pack script keys that many calls share (``Wire.submit`` takes them as they are)."""
    values = tuple(keys)
    return Packed(values, _packed_keys.__wrapped__(values))


def tail(keys: Sequence[str] | Packed, args: Sequence[Arg] | Packed) -> tuple[int, bytes]:
    """The part of a script call after the script: (the request's elements, packed bytes).

    The element count is the whole request's (command and script included), as
    ``REQUEST`` takes it. Keys given as a tuple are packed once and remembered (a
    lock's keys are the same on every call); a list is packed afresh. Either may
    come packed.
    """
    if isinstance(keys, Packed):
        count, packed = len(keys.values), keys.data
    elif isinstance(keys, tuple):
        count, packed = len(keys), _packed_keys(keys)
    else:
        count, packed = len(keys), _packed_keys.__wrapped__(tuple(keys))
    # FCALL (EVALSHA), the function (script), the key count, the keys, the arguments.
    if isinstance(args, Packed):
        return 3 + count + len(args.values), packed + args.data
    return 3 + count + len(args), b"".join([packed, *map(bulk, args)])


def refused(borrowed: Any) -> None:
    """Log that calls on ``borrowed``'s client go through redis-py from now on."""
    log.warning("cannot drive %r directly: every call goes through redis-py", borrowed)
