"""Requests packed by ``_redis.resp`` are byte for byte what redis-py would send."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from redis.connection import Connection

from headway._redis.resp import REQUEST, Arg, pack, pack_keys, tail
from headway._redis.scripts import EVAL, EVALSHA, FCALL, LOAD, Script

SCRIPT = Script.from_source("echo", "return {KEYS[1], ARGV[1]}")
KEYS = ("k1", "{tag}:k2")
ARGS: list[Arg] = ["é", 7, 0.5, b"\x00\xff", -3]


def redis_py(command: str, script: str, keys: Sequence[str]) -> bytes:
    packer = Connection()  # type: ignore[no-untyped-call]
    parts = packer.pack_command(command, script, len(keys), *keys, *ARGS)  # type: ignore[no-untyped-call]
    return b"".join(parts)


@pytest.mark.parametrize(
    ("keys", "ahead"),
    [
        (KEYS, False),  # keys as a tuple: packed once and remembered
        (list(KEYS), False),  # as a list: packed afresh
        (KEYS, True),  # keys and arguments packed ahead (``pack_keys``, ``pack``)
    ],
)
def test_a_request_is_framed_as_redis_py_frames_it(keys: Sequence[str], ahead: bool) -> None:
    count, packed = tail(pack_keys(keys), pack(ARGS)) if ahead else tail(keys, ARGS)
    fcall = redis_py("FCALL", SCRIPT.function, keys)
    assert REQUEST % (count, SCRIPT.head(FCALL), packed) == fcall
    assert REQUEST % (count, SCRIPT.head(LOAD), packed) == fcall
    assert REQUEST % (count, SCRIPT.head(EVALSHA), packed) == redis_py("EVALSHA", SCRIPT.sha, keys)
    assert REQUEST % (count, SCRIPT.head(EVAL), packed) == redis_py("EVAL", SCRIPT.source, keys)


def test_the_load_request_is_framed_as_redis_py_frames_it() -> None:
    packer = Connection()  # type: ignore[no-untyped-call]
    parts = packer.pack_command("FUNCTION", "LOAD", "REPLACE", SCRIPT.library)  # type: ignore[no-untyped-call]
    assert SCRIPT.load_request == b"".join(parts)
