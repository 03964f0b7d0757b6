"""How ``locked`` names the lock of one call: a format string over the call's
arguments by parameter name, or a function of them."""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Mapping
from typing import Any, cast

__all__ = ["CallNaming", "Name"]

Name = str | Callable[..., str]
"""A lock name for a call: a format string over its arguments, or a function of them."""


class CallNaming:
    """A call's lock name: ``name`` formatted over the bound arguments, or called.

    Built when decorating ``fn`` (a ``name`` naming no parameter is refused then),
    called with each call's arguments."""

    __slots__ = ("_fn", "_name", "_signature")

    def __init__(self, fn: Callable[..., Any], name: Name) -> None:
        self._fn = fn
        self._name = name
        self._signature = inspect.signature(fn)
        if isinstance(name, str):
            self._check(name)
        elif not callable(name):
            raise TypeError(f"name must be a str or a function, not {type(name).__name__}")

    def _check(self, template: str) -> None:
        """Refuse, when decorating, a field that names no parameter (unless ``**kwargs``)."""
        parameters = self._signature.parameters
        spread = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError as exc:
            raise ValueError(f"lock name {template!r} is not a format string: {exc}") from exc
        for field in fields:
            head = field.split(".", 1)[0].split("[", 1)[0]
            if not head or head.isdigit():
                raise ValueError(
                    f"lock name {template!r}: fields name parameters ({{invoice_id}}), "
                    f"not positions ({{{field}}})"
                )
            if head not in parameters and not spread:
                raise ValueError(
                    f"lock name {template!r} names {head!r}, which is no parameter of "
                    f"{self._fn.__qualname__}{self._signature}"
                )

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        name = self._name
        if not isinstance(name, str):
            made = name(*args, **kwargs)
            if not isinstance(made, str):
                raise TypeError(
                    f"the lock name function of {self._fn.__qualname__} returned "
                    f"{type(made).__name__}, not a str"
                )
            return made
        bound = self._signature.bind(*args, **kwargs)  # TypeError as the call would raise
        bound.apply_defaults()
        values: dict[str, Any] = {}
        for key, value in bound.arguments.items():
            kind = self._signature.parameters[key].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                values.update(cast(Mapping[str, Any], value))
            else:
                values[key] = value
        try:
            return name.format_map(values)
        except (KeyError, AttributeError, IndexError) as exc:
            raise ValueError(
                f"lock name {name!r} for {self._fn.__qualname__}: cannot format it from "
                f"the arguments {sorted(values)} ({type(exc).__name__}: {exc})"
            ) from exc
