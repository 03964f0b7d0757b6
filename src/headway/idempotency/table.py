"""The idempotency record table (SQLAlchemy 2 Core) and the database-clock expression.

One row per (caller, key), the caller in the ``scope`` column. ``expires_at`` and
``lease_expires_at`` are written and compared only with ``db_now()``, so every app
server agrees on time: the database's clock is the only one that decides.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

__all__ = ["db_now", "metadata", "records", "row_of"]

metadata = sa.MetaData()


# Microsecond timestamps everywhere (MySQL's DATETIME defaults to whole seconds).
_Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_Body = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


class _Utf8Binary(sa.TypeDecorator[str]):
    """Text kept as its UTF-8 bytes in VARBINARY, compared byte for byte."""

    impl = mysql.VARBINARY
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> bytes | None:
        return None if value is None else value.encode()

    def process_result_value(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else bytes(value).decode()


# Keys compare byte for byte. On MySQL/MariaDB that takes VARBINARY (255 characters of
# UTF-8 at most): every text collation there ignores case or trailing spaces (even
# utf8mb4_bin pads), which made "Order-1" and "order-1 " one key.
_Key = sa.String(255).with_variant(_Utf8Binary(1020), "mysql", "mariadb")

records = sa.Table(
    "headway_idempotency_records",
    metadata,
    # The record's caller (``caller`` in ``RecordBackend`` and ``RecordStore``): the hash
    # of the name the scope function gave, or a function's namespace. The column keeps
    # its first name, ``scope``: renaming it would take a migration for no behaviour.
    sa.Column("scope", sa.String(64), nullable=False),
    sa.Column("key", _Key, nullable=False),
    # sha256 hex of method, path, query, content type and body.
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("status", sa.String(10), nullable=False),
    # Fencing token of the lease that claimed the record; writes must match it.
    sa.Column("fence", sa.BigInteger, nullable=False),
    sa.Column("lease_token", sa.String(64), nullable=True),
    sa.Column("lease_expires_at", _Timestamp, nullable=True),
    sa.Column("response_status", sa.Integer, nullable=True),
    sa.Column("response_headers", sa.JSON, nullable=True),
    # NULL on a COMPLETED record: the response was too large to keep.
    sa.Column("response_body", _Body, nullable=True),
    sa.Column("created_at", _Timestamp, nullable=False),
    sa.Column("expires_at", _Timestamp, nullable=False),
    sa.PrimaryKeyConstraint("scope", "key", name="pk_headway_idempotency_records"),
    sa.CheckConstraint("status IN ('PROCESSING', 'COMPLETED')", name="ck_headway_idem_status"),
    sa.Index("ix_headway_idempotency_records_expires_at", "expires_at"),
)


def row_of(caller: str, key: str) -> sa.ColumnElement[bool]:
    """The condition that picks the record of (caller, key)."""
    return sa.and_(records.c.scope == caller, records.c.key == key)


class db_now(sa.sql.expression.FunctionElement[Any]):
    """The database server's current time plus ``seconds``, in the column's format.

    ``seconds`` is a bound argument, so statements using it are cached by SQLAlchemy
    like any other (a value kept outside the arguments would either defeat the cache
    or, worse, be frozen into the first compiled statement). It may be a named
    ``bindparam`` too, for a statement built once and given its values per call.
    """

    type = _Timestamp
    inherit_cache = True

    def __init__(self, seconds: float | sa.BindParameter[Any] = 0.0) -> None:
        if isinstance(seconds, sa.BindParameter):
            super().__init__(seconds)
        else:
            super().__init__(sa.literal(float(seconds), sa.Float()))


def _seconds(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


@compiles(db_now)
def _default(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return f"(CURRENT_TIMESTAMP + {_seconds(element, compiler, **kw)} * INTERVAL '1 second')"


@compiles(db_now, "postgresql")
def _postgresql(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    # clock_timestamp(), not now(): the time of the statement, not of the transaction.
    return f"(clock_timestamp() + make_interval(secs => {_seconds(element, compiler, **kw)}))"


@compiles(db_now, "sqlite")
def _sqlite(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    # The format SQLAlchemy's SQLite DateTime writes, so comparisons stay textual and exact.
    modifier = f"printf('%+.6f seconds', {_seconds(element, compiler, **kw)})"
    return f"strftime('%Y-%m-%d %H:%M:%f000', 'now', {modifier})"


@compiles(db_now, "mysql")
@compiles(db_now, "mariadb")
def _mysql(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    micros = f"CAST(ROUND({_seconds(element, compiler, **kw)} * 1000000) AS SIGNED)"
    return f"TIMESTAMPADD(MICROSECOND, {micros}, UTC_TIMESTAMP(6))"
