"""Lua scripts: loaded from ``headway/lua/`` (subfolders too), run with EVALSHA.

A Redis restart or ``SCRIPT FLUSH`` makes EVALSHA fail with NOSCRIPT; the same
call then falls back to EVAL (which also caches the script again), so callers
never see it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis import exceptions as redis_errors

from headway._redis.resp import Arg, bulk

__all__ = ["Script"]


def _source(name: str) -> str:
    # One folder at a time: a Traversable inside a zip takes no "a/b" path.
    path = resources.files("headway") / "lua"
    *folders, file = name.split("/")
    for folder in folders:
        path = path / folder
    return (path / f"{file}.lua").read_text("utf-8")


class Script:
    """One Lua script from the package, callable on async and sync clients."""

    def __init__(self, name: str, include: Sequence[str] = ()) -> None:
        """Load ``lua/<name>.lua``, preceded by the files named in ``include``.

        Names may have folders (``ratelimit/decide``). Included files define local
        functions the main script calls, so one script (one round trip) can combine
        pieces kept in separate files.
        """
        self._set(name, "\n".join(_source(part) for part in (*include, name)))

    @classmethod
    def from_source(cls, name: str, source: str) -> Script:
        """A script from Lua text rather than the package (tests, benchmarks)."""
        script = cls.__new__(cls)
        script._set(name, source)
        return script

    def _set(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        # Packed RESP heads of EVALSHA / EVAL of this script (``_redis.resp.REQUEST``).
        self.evalsha_head = bulk(b"EVALSHA") + bulk(self.sha)
        self.eval_head = bulk(b"EVAL") + bulk(source)

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
