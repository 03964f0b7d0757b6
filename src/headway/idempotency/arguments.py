"""What identifies one call of an idempotent function: its key and its fingerprint.

The fingerprint is a sha256 over the call's bound arguments (defaults applied, so
``f(1)`` and ``f(1, b=2)`` with ``b=2`` by default are the same call), encoded as
canonical JSON: dict keys sorted, sets sorted, and a tag on values JSON cannot tell
apart (bytes, dates, dataclasses...). It does not depend on the process, the Python
version or the hash seed, so every worker computes the same one. The default key is
the fingerprint itself; a ``key`` function names the call instead, and the fingerprint
then tells a retry (same arguments) from a reused key (different arguments).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import hashlib
import inspect
import json
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import Any

from headway.idempotency.request import MAX_KEY_LENGTH

__all__ = ["CallIdentity", "canonical", "check_str_keys"]


def _tagged(value: Any) -> Any:
    """``value`` as JSON-able data, tagged with its kind; TypeError if it has no stable form."""
    if isinstance(value, enum.Enum):
        return {"enum": f"{type(value).__qualname__}", "value": value.value}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return {type(value).__name__: value.isoformat()}
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return {type(value).__name__: str(value)}
    if isinstance(value, set | frozenset):
        return {"set": sorted(canonical(v) for v in value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"dataclass": type(value).__qualname__, "fields": fields}
    dump = getattr(value, "model_dump", None)  # pydantic v2 models, without importing pydantic
    if callable(dump):
        return {"model": type(value).__qualname__, "fields": dump(mode="json")}
    raise TypeError(f"{type(value).__module__}.{type(value).__qualname__}")


def check_str_keys(value: Any) -> Any:
    """Reject dicts whose keys JSON would silently turn into strings (1 and "1" would collide)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"dict key of type {type(k).__qualname__} (keys must be str)")
            check_str_keys(v)
    elif isinstance(value, list | tuple):
        for v in value:
            check_str_keys(v)
    return value


def canonical(value: Any) -> str:
    """``value`` as canonical JSON text; TypeError naming what has no stable encoding."""
    return json.dumps(
        check_str_keys(value),
        default=lambda v: check_str_keys(_tagged(v)),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


class CallIdentity:
    """Computes (key, fingerprint) for calls of one function.

    ``ignore`` names parameters left out of both (a session, a logger, ``self``).
    ``key``, if given, is called with the call's arguments and returns the key.
    """

    __slots__ = ("_ignore", "_key", "_name", "_signature")

    def __init__(
        self, fn: Callable[..., Any], key: Callable[..., str] | None, ignore: Collection[str]
    ) -> None:
        self._signature = inspect.signature(fn)
        unknown = set(ignore) - set(self._signature.parameters)
        if unknown:
            raise ValueError(f"ignore names no parameter of {fn.__qualname__}: {sorted(unknown)}")
        self._ignore = frozenset(ignore)
        self._key = key
        self._name = fn.__qualname__

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str]:
        """The call's (key, fingerprint). TypeError/ValueError on arguments it cannot use."""
        bound = self._signature.bind(*args, **kwargs)  # a wrong call fails as the function would
        bound.apply_defaults()
        kept = {n: v for n, v in bound.arguments.items() if n not in self._ignore}
        try:
            text = canonical(kept)
        except (TypeError, ValueError):
            raise self._unusable(kept) from None
        digest = hashlib.sha256(text.encode()).hexdigest()
        if self._key is None:
            return digest, digest
        key = self._key(*args, **kwargs)
        if not isinstance(key, str):
            raise TypeError(f"{self._name}: key function returned {type(key).__name__}, not str")
        if not 1 <= len(key) <= MAX_KEY_LENGTH:
            raise ValueError(f"{self._name}: key must be 1 to {MAX_KEY_LENGTH} characters")
        return key, digest

    def _unusable(self, kept: dict[str, Any]) -> TypeError:
        """The error naming the first argument that has no stable encoding."""
        for name, value in kept.items():
            try:
                canonical(value)
            except (TypeError, ValueError) as exc:
                return TypeError(
                    f"{self._name}: argument {name!r} cannot be fingerprinted ({exc}); "
                    f"pass ignore=({name!r},) to leave it out, or pass JSON-like data"
                )
        return TypeError(f"{self._name}: the arguments cannot be fingerprinted")
