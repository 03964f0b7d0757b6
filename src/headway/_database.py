"""Database URLs and errors, in words a newcomer can act on.

``create_engine`` is ``create_async_engine`` that answers a sync URL or a missing
driver with one line naming the async URL or the extra to install; ``shown`` is a URL
fit to print (password hidden); ``table_missing`` tells "the records table does not
exist" apart from other database errors on PostgreSQL, MySQL/MariaDB and SQLite.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

__all__ = ["create_engine", "parse", "shown", "table_missing"]

#: backend -> (the async driver headway is tested with, how to install it: "" when
#: headway already depends on it)
ASYNC_DRIVERS: dict[str, tuple[str, str]] = {
    "postgresql": ("asyncpg", "pip install 'headway[postgres]'"),
    "mysql": ("aiomysql", "pip install 'headway[mysql]'"),
    "mariadb": ("aiomysql", "pip install 'headway[mysql]'"),
    "sqlite": ("aiosqlite", ""),
}


def shown(url: str | URL) -> str:
    """``url`` as it may be printed: the password replaced by ``***``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sa_exc.ArgumentError:  # not parsable, or no such dialect: hide what looks like one
        return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", str(url))


def parse(url: str | URL) -> URL:
    """``make_url(url)``; ``ValueError`` saying so when it is not a URL."""
    try:
        return make_url(url)
    except sa_exc.ArgumentError as exc:
        raise ValueError(f"{shown(url)} is not a database URL headway can use: {exc}") from exc


def create_engine(url: str | URL, **options: Any) -> AsyncEngine:
    """``create_async_engine(url, **options)``; a URL headway cannot use raises
    ``ValueError`` (not a URL, no such dialect, a sync driver) or ``ImportError`` (the
    driver is not installed) with one line saying what to do instead."""
    parsed = parse(url)
    try:
        return create_async_engine(parsed, **options)
    except ImportError as exc:
        raise ImportError(_missing_driver(parsed, exc.name), name=exc.name) from exc
    except sa_exc.NoSuchModuleError as exc:
        raise ValueError(
            f"{shown(url)} names a database or driver SQLAlchemy does not know; headway runs "
            "on postgresql+asyncpg://, mysql+aiomysql:// and sqlite+aiosqlite:///"
        ) from exc
    except sa_exc.InvalidRequestError as exc:
        if "async" not in str(exc):
            raise
        raise ValueError(_sync_driver(parsed)) from exc


def _suggestion(url: URL) -> str:
    """The async URL to use instead of ``url`` and how to install its driver, as a
    clause (empty when headway knows no async driver for the backend)."""
    backend = url.get_backend_name()
    if backend not in ASYNC_DRIVERS:
        return ""
    driver, install = ASYNC_DRIVERS[backend]
    suggested = shown(url.set(drivername=f"{backend}+{driver}"))
    return f"use {suggested}" + (f" ({install})" if install else "")


def _missing_driver(url: URL, module: str | None) -> str:
    backend, driver = url.get_backend_name(), url.get_driver_name()
    missing = f"{shown(url)} needs the driver {module}, which is not installed"
    if ASYNC_DRIVERS.get(backend, ("", ""))[0] == driver:  # the right driver, not installed
        install = ASYNC_DRIVERS[backend][1]
        return f"{missing}: {install}" if install else missing
    instead = _suggestion(url)
    return f"{missing}; {instead}" if instead else missing


def _sync_driver(url: URL) -> str:
    sync = f"{shown(url)} names {url.get_driver_name()}, a sync driver; headway needs an async one"
    instead = _suggestion(url)
    return f"{sync}: {instead}" if instead else sync


def table_missing(exc: BaseException, table: str) -> bool:
    """Whether ``exc`` (a SQLAlchemy or driver error) says that ``table`` does not exist."""
    for error in _causes(exc):
        if table not in str(error):
            continue
        if getattr(error, "sqlstate", None) == "42P01":  # PostgreSQL: undefined_table
            return True
        if error.args and error.args[0] == 1146:  # MySQL/MariaDB: ER_NO_SUCH_TABLE
            return True
        if str(error).startswith("no such table"):  # SQLite
            return True
    return False


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the driver's error it wraps, and what caused those (a short chain)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        error = todo.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        todo += [getattr(error, "orig", None), error.__cause__]
