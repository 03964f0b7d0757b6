"""Every exception class a public callable's own body raises (``raise X(...)``) is named
in its docstring's ``Raises:`` (or its contract's), itself or by a base class; the
callables are ``test_docstrings.py``'s. A heuristic: what a helper it calls raises is not
seen, nor what a factory builds (``_DirectRaises`` says what is left out, and why).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import headway
from headway import _errors as headway_errors
from tests.test_docstrings import documented_callables, sections


class _DirectRaises(ast.NodeVisitor):
    """What a function body raises itself: the called names of ``raise X(...)``.

    Narrowed to what the docstring can promise: a bare ``raise`` or ``raise exc`` passes on
    an exception the body caught (its origin documents it), and the bodies of nested
    functions, lambdas and classes run elsewhere (a callback, a task), so neither counts.
    """

    def __init__(self) -> None:
        self.called: list[ast.expr] = []

    def visit_Raise(self, node: ast.Raise) -> None:
        if isinstance(node.exc, ast.Call):
            self.called.append(node.exc.func)

    def _nested(self, node: ast.AST) -> None:
        """Not entered."""

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _nested


def _exception_class(called: ast.expr, names: dict[str, Any]) -> str | None:
    """The exception class ``called`` names (``X`` or ``module.X``), or None.

    None too for a call that builds the exception (``raise self._not_owned(lease)``,
    ``raise unavailable(exc)``): a factory's class is not in the source, and backends
    that raise through one document the errors in their contract's ``Raises:``.
    """
    found: Any = None
    if isinstance(called, ast.Name):
        found = names.get(called.id)
    elif isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name):
        found = getattr(names.get(called.value.id), called.attr, None)
    is_error = inspect.isclass(found) and issubclass(found, BaseException)
    return found.__name__ if is_error else None


def raised_directly(function: Callable[..., Any]) -> list[str]:
    """The exception classes ``function``'s own body raises (``raise X(...)``), by name."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):  # generated (a dataclass's __init__): no source
        return []
    definition = ast.parse(source).body[0]
    assert isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef)
    finder = _DirectRaises()
    for statement in definition.body:
        finder.visit(statement)
    names = {**vars(builtins), **getattr(function, "__globals__", {})}
    raised = [_exception_class(called, names) for called in finder.called]
    return list(dict.fromkeys(name for name in raised if name is not None))


def _covers(documented: str, raised: str, function: Callable[..., Any]) -> bool:
    """Whether the ``Raises:`` entry ``documented`` covers ``raised``: the same name, or
    a base class of it (``HeadwayError:`` covers each of its kinds)."""
    if documented == raised:
        return True
    names = {**vars(builtins), **vars(headway_errors), **getattr(function, "__globals__", {})}
    found, base = names.get(raised), names.get(documented)
    return inspect.isclass(found) and inspect.isclass(base) and issubclass(found, base)


def undocumented_raises() -> list[str]:
    """Each exception a public callable raises itself that its ``Raises:`` leaves out."""
    found: list[str] = []
    for item in documented_callables():
        raised = raised_directly(item.function)
        if not raised:
            continue
        docs = [item.doc or "", *item.contract_docs]
        promised = [n for doc in docs for n in sections(doc).get("Raises", [])]
        found.extend(
            f"{item.where}: raises {name}, not in Raises"
            for name in raised
            if not any(_covers(p, name, item.function) for p in promised)
        )
    return found


def test_raises_are_found_in_the_body_not_in_nested_functions() -> None:
    def example(value: int) -> None:
        try:
            int("x")
        except ValueError:
            print("logged")
            raise  # passed on: not counted
        if value < 0:
            raise ValueError("negative")

        def later() -> None:
            raise KeyError("elsewhere")  # a nested function's: not counted

        raise headway.LockNotAcquired("busy", resource="r") from None

    assert raised_directly(example) == ["ValueError", "LockNotAcquired"]


def test_every_exception_raised_directly_is_in_raises() -> None:
    missing = undocumented_raises()
    assert not missing, f"{len(missing)} raise(s) undocumented:\n" + "\n".join(missing)
