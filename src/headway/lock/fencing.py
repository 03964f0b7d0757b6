"""Fenced writes: how a SQL resource rejects a lock holder whose lease has lapsed.

A lock alone cannot protect a write: a holder paused (GC, SIGSTOP, a slow
network) past its lease still believes it holds the lock when it wakes up. The
resource must check the lease's fencing token itself. ``fenced_update`` is that
check as one compare-and-set statement::

    UPDATE table SET <values>, fence = :token
    WHERE <where> AND (fence IS NULL OR fence <= :token)

The row remembers the highest token that wrote it; a write carrying a lower
token changes nothing and reports ``False``. An equal token is accepted, so one
holder can write the same row several times under one lease. The database
evaluates the condition on the row it locks for the update (PostgreSQL
re-checks it on the newest row version after waiting for a concurrent writer),
so concurrent writers cannot both slip past it.

A read-modify-write must fence its read too: read the row ``FOR UPDATE`` (or
claim it first with a fenced update of no other column) in the same
transaction as the fenced write. Otherwise a stale holder that read before the
new holder wrote, but writes first, is accepted, and the new holder's write
then overwrites it: an increment is lost although every write was fenced.

One statement builder, two thin shells: ``fenced_update`` for ``AsyncConnection``
and ``AsyncSession``, ``fenced_update_sync`` for ``Connection`` and ``Session``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, Table, Update, and_, or_, update
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

__all__ = ["fenced_update", "fenced_update_statement", "fenced_update_sync"]

#: ``where`` is a SQL condition, or column name -> value pairs compared with ``=``.
Where = ColumnElement[bool] | Mapping[str, Any]


def fenced_update_statement(
    table: Table,
    where: Where,
    values: Mapping[str, Any],
    *,
    fence: int,
    fence_column: str = "fence",
) -> Update:
    """Build the fenced ``UPDATE`` (without running it), e.g. to add ``.returning()``.

    A row whose fence is NULL has never been written under a lock and accepts any
    token.

    Args:
        table: The SQLAlchemy ``Table`` written.
        where: The row to write: a SQL condition, or column name -> value pairs
            compared with ``=``; it must select at most one row (a primary or unique
            key).
        values: Column name -> value to write; values may be SQL expressions
            (``{"n": table.c.n + 1}``). Not the fence column.
        fence: The lease's fencing token (``Lease.fence``).
        fence_column: The column remembering the highest fence; default ``"fence"``.

    Raises:
        TypeError: ``fence`` is not an int.
        ValueError: ``values`` sets the fence column, or ``where`` is an empty mapping.
    """
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise TypeError(f"fence must be an int, not {type(fence).__name__}")
    if fence_column in values:
        raise ValueError(f"values must not set the fence column {fence_column!r} itself")
    column = table.c[fence_column]
    if isinstance(where, Mapping):
        if not where:
            raise ValueError("where must select the row to update, got no condition")
        where = and_(*(table.c[name] == value for name, value in where.items()))
    return (
        update(table)
        .where(where, or_(column.is_(None), column <= fence))
        .values({**values, fence_column: fence})
    )


def _accepted(result: Any) -> bool:
    rows = cast(CursorResult[Any], result).rowcount
    if rows > 1:
        raise ValueError(
            f"a fenced update must target one row, but its condition matched {rows}; "
            "they were all written: roll the transaction back"
        )
    return rows == 1


async def fenced_update(
    conn: AsyncConnection | AsyncSession,
    table: Table,
    where: Where,
    values: Mapping[str, Any],
    *,
    fence: int,
    fence_column: str = "fence",
) -> bool:
    """Write ``values`` to the row ``where`` selects, unless a higher fence already wrote it.

    Returns ``True`` if the write was accepted (the row now carries ``fence``),
    ``False`` if the row holds a higher fence or does not exist. The statement
    runs in the caller's transaction; committing it stays the caller's job.

    Args:
        conn: The ``AsyncConnection`` or ``AsyncSession`` whose transaction the statement runs in.
        table: The SQLAlchemy ``Table`` written.
        where: The row to write: a SQL condition, or column name -> value pairs
            compared with ``=``; it must select at most one row (a primary or unique
            key).
        values: Column name -> value to write; values may be SQL expressions
            (``{"n": table.c.n + 1}``). Not the fence column.
        fence: The lease's fencing token (``Lease.fence``).
        fence_column: The column remembering the highest fence; default ``"fence"``.

    Raises:
        TypeError: ``fence`` is not an int.
        ValueError: ``values`` sets the fence column, or ``where`` is an empty mapping;
            or the condition matched several rows (all written: roll back).
    """
    stmt = fenced_update_statement(table, where, values, fence=fence, fence_column=fence_column)
    return _accepted(await conn.execute(stmt))


def fenced_update_sync(
    conn: Connection | Session,
    table: Table,
    where: Where,
    values: Mapping[str, Any],
    *,
    fence: int,
    fence_column: str = "fence",
) -> bool:
    """The synchronous ``fenced_update``, for ``Connection`` and ``Session``.

    Returns ``True`` if the write was accepted (the row now carries ``fence``),
    ``False`` if the row holds a higher fence or does not exist.

    Args:
        conn: The ``Connection`` or ``Session`` whose transaction the statement runs in.
        table: The SQLAlchemy ``Table`` written.
        where: The row to write: a SQL condition, or column name -> value pairs
            compared with ``=``; it must select at most one row (a primary or unique
            key).
        values: Column name -> value to write; values may be SQL expressions
            (``{"n": table.c.n + 1}``). Not the fence column.
        fence: The lease's fencing token (``Lease.fence``).
        fence_column: The column remembering the highest fence; default ``"fence"``.

    Raises:
        TypeError: ``fence`` is not an int.
        ValueError: ``values`` sets the fence column, or ``where`` is an empty mapping;
            or the condition matched several rows (all written: roll back).
    """
    stmt = fenced_update_statement(table, where, values, fence=fence, fence_column=fence_column)
    return _accepted(conn.execute(stmt))
