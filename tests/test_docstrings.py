"""Every public name has a docstring, and every parameter is named in an ``Args:`` section.

The reference (mkdocstrings, Google style) is generated from these docstrings, so an
option a docstring leaves out is an option the reference does not show. The convention:

- Google-style sections: ``Args:``, then one ``name: what it is, default, unit`` per
  parameter (``*name`` for a named ``*`` parameter); ``Raises:`` names the errors.
- A class documents its constructor in the class docstring (``__init__`` has none of its
  own; mkdocstrings merges the two). A dataclass whose fields are read rather than
  passed (a result, an event) may list them under ``Attributes:`` instead.
- A backend's method that implements a public contract (a Protocol of ``__all__`` the
  class satisfies: ``RateLimitBackend.decide``, ``LockBackend.acquire``...) keeps its own
  summary and may leave its ``Args:`` to the contract's, which names the same parameters:
  the options are written once, where an implementer reads them.
- Covered: each name of ``headway.__all__``: a function's parameters; a class's
  constructor (not a Protocol's: it has none) and its public methods (no leading ``_``,
  classmethods and staticmethods included, inherited ones from headway's own bases
  included, checked once where they are defined). A method without a docstring of its
  own takes its base's, as ``inspect.getdoc`` does. ``self``, ``cls``, ``*args`` and
  ``**kwargs`` are not parameters to document.
- A type alias is documented by the string right after its assignment (what
  mkdocstrings reads), not by a ``#:`` comment.
- An ``Args:`` entry must name a parameter (no stale options), and a ``Raises:`` entry an
  exception that exists (a public headway error or a built-in).
- Every exception class a covered callable's own body raises (``raise X(...)``) is named
  in its ``Raises:`` (or its contract's), itself or by a base class:
  ``test_docstring_raises.py``.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import inspect
import itertools
import re
import typing
from collections.abc import Callable, Iterator
from typing import Any

import headway

SECTION = re.compile(r"^(?P<indent> *)(?P<title>[A-Z][A-Za-z ]*):\s*$")
ENTRY = re.compile(r"^(?P<name>\*{0,2}[A-Za-z_][A-Za-z0-9_]*)(?: *\([^)]*\))?:(?:\s|$)")
UNDOCUMENTED = {"self", "cls", "args", "kwargs"}


def sections(doc: str) -> dict[str, list[str]]:
    """The Google-style sections of ``doc``: title -> the names its entries start with."""
    found: dict[str, list[str]] = {}
    lines = inspect.cleandoc(doc).splitlines()
    i = 0
    while i < len(lines):
        match = SECTION.match(lines[i])
        i += 1
        if match is None:
            continue
        indent = len(match["indent"])
        names = found.setdefault(match["title"], [])
        entry_indent: int | None = None
        while i < len(lines):
            line = lines[i]
            stripped = line.lstrip()
            depth = len(line) - len(stripped)
            if stripped and depth <= indent:
                break
            i += 1
            if not stripped:
                continue
            if entry_indent is None:
                entry_indent = depth
            if depth == entry_indent and (entry := ENTRY.match(stripped)) is not None:
                names.append(entry["name"].lstrip("*"))
    return found


def _own_doc(obj: Any) -> str | None:
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return doc if isinstance(doc, str) and doc.strip() else None


def _defined_by(cls: type, name: str) -> type | None:
    return next((base for base in cls.__mro__ if name in base.__dict__), None)


def _is_headway(owner: type | None) -> bool:
    return owner is not None and owner.__module__.split(".")[0] == "headway"


def _method_doc(cls: type, name: str) -> str | None:
    for base in cls.__mro__:
        if name in base.__dict__ and (doc := _own_doc(_function(base.__dict__[name]))):
            return doc
    return None


def _function(attr: Any) -> Any:
    return attr.__func__ if isinstance(attr, classmethod | staticmethod) else attr


def _protocol_members(protocol: type) -> set[str]:
    """The public members a Protocol asks for (its own and its base Protocols')."""
    members: set[str] = set()
    for base in protocol.__mro__:
        if getattr(base, "_is_protocol", False) and base is not typing.Protocol:
            names = [*base.__dict__, *inspect.get_annotations(base)]
            members |= {n for n in names if not n.startswith("_")}
    return members


def _contracts(cls: type) -> list[type]:
    """The public Protocols ``cls`` satisfies (has every member of), not counting itself."""
    found = []
    for public in headway.__all__:
        candidate = getattr(headway, public)
        if (
            inspect.isclass(candidate)
            and getattr(candidate, "_is_protocol", False)
            and candidate is not cls
            and all(hasattr(cls, member) for member in _protocol_members(candidate))
        ):
            found.append(candidate)
    return found


def _contract_docs(cls: type, name: str) -> list[str]:
    """The docstrings of the contract methods ``cls.name`` implements."""
    docs = []
    for contract in _contracts(cls):
        owner = _defined_by(contract, name)
        if owner is not None and (doc := _own_doc(owner.__dict__[name])):
            docs.append(doc)
    return docs


def _is_dataclass_init(cls: type) -> bool:
    return dataclasses.is_dataclass(cls) and "__init__" in cls.__dict__


class Documented:
    """One documented callable: where it is defined, its parameters, its docstring."""

    def __init__(
        self,
        where: str,
        function: Callable[..., Any],
        doc: str | None,
        *,
        attributes_allowed: bool = False,
        contract_docs: list[str] | None = None,
    ) -> None:
        self.where = where
        self.function = function
        self.doc = doc
        self.attributes_allowed = attributes_allowed
        self.contract_docs = contract_docs or []

    def parameters(self) -> list[str]:
        signature = inspect.signature(self.function)
        return [
            p.name
            for p in signature.parameters.values()
            if p.name not in UNDOCUMENTED
            and p.kind is not p.VAR_KEYWORD
            and not (p.kind is p.VAR_POSITIONAL and p.name == "args")
        ]


def documented_callables() -> Iterator[Documented]:
    """Every callable of the public surface, once per place it is defined."""
    seen: set[str] = set()
    for public in headway.__all__:
        obj = getattr(headway, public)
        if inspect.isroutine(obj):
            yield Documented(public, obj, _own_doc(obj))
            continue
        if not inspect.isclass(obj):
            continue
        init_owner = _defined_by(obj, "__init__")
        if not getattr(obj, "_is_protocol", False) and _is_headway(init_owner):
            assert init_owner is not None
            key = f"{init_owner.__module__}.{init_owner.__qualname__}"
            if key not in seen:
                seen.add(key)
                yield Documented(
                    init_owner.__name__,
                    init_owner.__dict__["__init__"],
                    _own_doc(init_owner),
                    attributes_allowed=_is_dataclass_init(init_owner),
                )
        for name in sorted(dir(obj)):
            if name.startswith("_"):
                continue
            owner = _defined_by(obj, name)
            if not _is_headway(owner):
                continue
            assert owner is not None
            attr = owner.__dict__[name]
            function = _function(attr)
            if not inspect.isfunction(function):
                continue  # properties, constants, nested classes
            key = f"{owner.__module__}.{owner.__qualname__}.{name}"
            if key in seen:
                continue
            seen.add(key)
            yield Documented(
                f"{owner.__name__}.{name}",
                function,
                _method_doc(obj, name),
                contract_docs=_contract_docs(obj, name),
            )


def _alias_documented(name: str) -> bool:
    """Whether the type alias ``name`` has a string right after its assignment."""
    module = importlib.import_module(headway._SOURCE[name])
    body = ast.parse(inspect.getsource(module)).body
    for statement, following in itertools.pairwise(body):
        targets = (
            statement.targets
            if isinstance(statement, ast.Assign)
            else [statement.target]
            if isinstance(statement, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            )
    return False


def _is_error(name: str) -> bool:
    source = headway if name in headway.__all__ else builtins
    found = getattr(source, name, None)
    return inspect.isclass(found) and issubclass(found, BaseException)


def gaps() -> list[str]:
    """What the reference would leave out, one line each."""
    found: list[str] = []
    for public in headway.__all__:
        obj = getattr(headway, public)
        if inspect.isclass(obj) or inspect.isroutine(obj):
            if _own_doc(obj) is None:
                found.append(f"{public}: no docstring")
        elif not _alias_documented(public):
            found.append(f"{public}: no docstring after the alias")
    for item in documented_callables():
        parameters = item.parameters()
        if item.doc is None:
            if parameters or "." in item.where:
                found.append(f"{item.where}: no docstring ({', '.join(parameters)})")
            continue
        parts = sections(item.doc)
        named = set(parts.get("Args", []))
        if item.attributes_allowed:
            named |= set(parts.get("Attributes", []))
        if "Args" not in parts:
            for doc in item.contract_docs:
                named |= set(sections(doc).get("Args", []))
        found.extend(f"{item.where}: `{p}` not in Args" for p in parameters if p not in named)
        found.extend(
            f"{item.where}: Args names `{n}`, not a parameter"
            for n in parts.get("Args", [])
            if n not in parameters
        )
        found.extend(
            f"{item.where}: Raises names `{n}`, not an exception"
            for n in parts.get("Raises", [])
            if not _is_error(n)
        )
    return found


def test_sections_are_parsed() -> None:
    doc = """Summary.

    Args:
        ttl: seconds.
            Continued: not an entry.
        *policies (Policy): each one.
        timeout: how long.

    Raises:
        LockNotAcquired: when it gives up.
    """
    assert sections(doc) == {"Args": ["ttl", "policies", "timeout"], "Raises": ["LockNotAcquired"]}


def test_every_parameter_is_documented() -> None:
    missing = gaps()
    assert not missing, f"{len(missing)} gap(s) in the reference:\n" + "\n".join(missing)
