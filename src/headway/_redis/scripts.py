"""Lua scripts: loaded from ``headway/lua/`` (subfolders too), run as Redis functions.

Each script is also a function library (``FUNCTION LOAD``): the files it includes run
once, when the library loads, and the script's own body becomes the library's one
function, called with ``FCALL``. As an ``EVAL`` script the includes would run again
on every call, defining their local functions and tables afresh (measured in
``docs/decisions/redis.md``, "Scripts as Redis functions").

A call goes through stages (``resend_stage``), each tried only when the one before
failed in a way that says the call did not run:

``FCALL`` -> (Function not found: a new server, ``FUNCTION FLUSH``) ``LOAD``: the
library is loaded and the same call made in one write -> (still not found: the load
was refused; or functions refused outright: Redis 6, a proxy, a user not allowed them)
``EVALSHA`` -> (NOSCRIPT) ``EVAL``. A wire told that functions are refused
(``functions_refused``: a permission or an unknown command, never an error from inside
a script) sends ``EVALSHA`` from then on (``functions`` on its owner); redis-py's own
path (``run``) always does.

A script that frees what it holds (a lock's release, a slot's release) is registered
``allow-oom``: Redis refuses a function without flags outright when it is out of memory
(``maxmemory`` with ``noeviction``), and a lock that cannot be released is worse than a
few bytes over the limit.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis import exceptions as redis_errors

from headway._redis.resp import Arg, bulk

__all__ = [
    "EVAL",
    "EVALSHA",
    "FCALL",
    "LOAD",
    "Script",
    "functions_refused",
    "load_failed",
    "resend_stage",
]

log = logging.getLogger("headway")

#: How a call is sent, in the order tried (see the module's docstring).
FCALL, LOAD, EVALSHA, EVAL = range(4)


def _source(name: str) -> str:
    # One folder at a time: a Traversable inside a zip takes no "a/b" path.
    path = resources.files("headway") / "lua"
    *folders, file = name.split("/")
    for folder in folders:
        path = path / folder
    return (path / f"{file}.lua").read_text("utf-8")


class Script:
    """One Lua script from the package, callable on async and sync clients."""

    def __init__(self, name: str, include: Sequence[str] = (), allow_oom: bool = False) -> None:
        """Load ``lua/<name>.lua``, preceded by the files named in ``include``.

        Names may have folders (``ratelimit/decide``). Included files define local
        functions the main script calls, so one script (one round trip) can combine
        pieces kept in separate files. ``allow_oom``: its function runs on a Redis out
        of memory (for scripts that free memory, see the module's docstring).
        """
        included = "\n".join(_source(part) for part in include)
        self._set(name, included, _source(name), allow_oom)

    @classmethod
    def from_source(cls, name: str, source: str) -> Script:
        """A script from Lua text rather than the package (tests, benchmarks)."""
        script = cls.__new__(cls)
        script._set(name, "", source)
        return script

    def _set(self, name: str, included: str, body: str, allow_oom: bool = False) -> None:
        self.name = name
        self.source = f"{included}\n{body}" if included else body
        self.sha = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()
        flags = "{'allow-oom'}" if allow_oom else "{}"
        # One library per library text, named after its hash: a changed script (or split
        # between includes and body, or flags) is a new library, never a replaced one.
        shape = f"{flags}\0{included}\0{body}".encode()
        self.function = f"headway_{hashlib.sha1(shape, usedforsecurity=False).hexdigest()}"
        self.library = (
            f"#!lua name={self.function}\n{included}\n"
            f"redis.register_function{{function_name='{self.function}', flags={flags},\n"
            f"callback=function(KEYS, ARGV)\n{body}\nend}}\n"
        )
        # Packed RESP heads of each stage's command (``_redis.resp.REQUEST``).
        self._heads = {
            FCALL: bulk(b"FCALL") + bulk(self.function),
            LOAD: bulk(b"FCALL") + bulk(self.function),
            EVALSHA: bulk(b"EVALSHA") + bulk(self.sha),
            EVAL: bulk(b"EVAL") + bulk(self.source),
        }
        #: The whole ``FUNCTION LOAD REPLACE`` request, written before the call at ``LOAD``.
        load: tuple[Arg, ...] = (b"FUNCTION", b"LOAD", b"REPLACE", self.library)
        self.load_request = b"*4\r\n" + b"".join(map(bulk, load))

    def head(self, stage: int) -> bytes:
        """The command and script (or function) of a call sent at ``stage``."""
        return self._heads[stage]

    async def run(self, client: Any, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """Run on a ``redis.asyncio`` client (single node or Cluster)."""
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except redis_errors.NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)

    def run_sync(self, client: Any, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """Run on a synchronous ``redis`` client."""
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis_errors.NoScriptError:
            return client.eval(self.source, len(keys), *keys, *args)


def resend_stage(stage: int, reply: Exception) -> int | None:
    """The stage to send a call again at, after ``reply`` (an error) at ``stage``.

    None: the error stands (the call ran, or failed for a reason a resend cannot fix).
    An error raised inside a script never moves a call on: what ran before it stays.
    """
    if stage == EVALSHA:
        return EVAL if isinstance(reply, redis_errors.NoScriptError) else None
    if stage == EVAL:
        return None
    if str(reply) == "Function not found":
        return LOAD if stage == FCALL else EVALSHA
    return EVALSHA if functions_refused(reply) else None


def functions_refused(reply: Any) -> bool:
    """Whether ``reply`` says this server (or this user) runs no functions: ``FCALL`` or
    ``FUNCTION LOAD`` refused by the ACL, or unknown to the server (Redis 6, a proxy).

    Read from how the reply starts: an error from inside a script ("ERR ACL failure in
    script: ... no permissions ...") names the function too, and is not one of these.
    """
    if not isinstance(reply, redis_errors.ResponseError):
        return False
    message = str(reply).lower()
    if isinstance(reply, redis_errors.NoPermissionError):
        return "'fcall'" in message or "'function|load'" in message
    return message.startswith("unknown command") and ("fcall" in message or "function" in message)


def load_failed(reply: Any) -> bool:
    """Log a ``FUNCTION LOAD`` refused; True if it says functions are refused outright."""
    if not isinstance(reply, Exception):
        return False
    log.warning("Redis did not load headway's function library (%s)", reply)
    return functions_refused(reply)
