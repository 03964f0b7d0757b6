"""How an idempotent function's result (or stored error) becomes bytes in its record.

A serializer is anything with ``dumps(value) -> bytes`` and ``loads(bytes) -> value``
(``Serializer``); ``JsonSerializer`` is the default. A value it cannot store
faithfully raises ``TypeError`` naming the type, before anything is stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Protocol

from headway.idempotency.arguments import canonical, check_str_keys

__all__ = ["JsonSerializer", "Serializer", "dump_error", "load_error"]


class Serializer(Protocol):
    """Turns results into bytes and back (``loads(dumps(v))`` is what every caller gets)."""

    def dumps(self, value: Any) -> bytes:
        """``value`` as bytes.

        Args:
            value: The function's result (or a stored error's data).

        Raises:
            TypeError: ``value`` cannot be stored faithfully (the message names its type).
        """
        ...

    def loads(self, data: bytes) -> Any:
        """The value ``dumps`` wrote.

        Args:
            data: The bytes ``dumps`` returned.
        """
        ...


def _refuse(value: Any) -> Any:
    raise TypeError(
        f"a value of type {type(value).__module__}.{type(value).__qualname__} is not JSON"
    )


class JsonSerializer:
    """JSON (UTF-8): dicts with str keys, lists, str, int, float, bool and None.

    Tuples come back as lists. NaN, infinities and non-str dict keys are refused
    rather than changed on the way (JSON has none of them).
    """

    def dumps(self, value: Any) -> bytes:
        """``value`` as JSON bytes.

        Args:
            value: The function's result.

        Raises:
            TypeError: ``value`` holds what JSON cannot (the message names it).
        """
        try:
            text = json.dumps(value, default=_refuse, allow_nan=False, separators=(",", ":"))
        except ValueError as exc:  # NaN, infinity, a circular reference
            raise TypeError(f"{exc}: JSON has no NaN, no infinity, no circular values") from None
        check_str_keys(value)  # after dumps, which refuses circular values first
        return text.encode()

    def loads(self, data: bytes) -> Any:
        """The value ``dumps`` wrote.

        Args:
            data: The bytes ``dumps`` returned.
        """
        return json.loads(data)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def dump_error(exc: BaseException) -> bytes:
    """A stored exception: its class's qualified name and its arguments, as JSON.

    Arguments JSON cannot hold are replaced by the exception's message.
    """
    args: list[Any] = list(exc.args)
    try:
        canonical(args)
    except (TypeError, ValueError):
        args = [str(exc)]
    return json.dumps({"type": _qualified(type(exc)), "args": args}).encode()


def load_error(data: bytes, classes: Iterable[type[BaseException]]) -> BaseException | None:
    """The stored exception rebuilt as one of ``classes`` (by name), or None if none matches.

    Only the configured classes are ever built: the record names a class, it never
    chooses code to import.
    """
    stored = json.loads(data)
    for cls in classes:
        if _qualified(cls) == stored["type"]:
            try:
                return cls(*stored["args"])
            except Exception:
                return None
    return None
