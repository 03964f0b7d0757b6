"""Idempotency keys compare byte for byte on MySQL/MariaDB: the key column is VARBINARY.

Their text collations ignore case (``utf8mb4_general_ci``, ``utf8mb4_0900_ai_ci``) or
trailing spaces (``utf8mb4_bin`` is PAD SPACE), so one caller's keys ``"Order-1"`` and
``"order-1 "`` met the same record: the second was replayed the first's response
instead of running. VARBINARY compares bytes, padding nothing; 1020 bytes hold 255
characters of UTF-8. PostgreSQL and SQLite already compare keys exactly: this revision
changes nothing there.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TABLE = "headway_idempotency_records"


def _is_mysql() -> bool:
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    if _is_mysql():
        op.alter_column(
            TABLE,
            "key",
            existing_type=sa.String(255),
            type_=mysql.VARBINARY(1020),
            existing_nullable=False,
        )


def downgrade() -> None:
    if _is_mysql():
        op.alter_column(
            TABLE,
            "key",
            existing_type=mysql.VARBINARY(1020),
            type_=sa.String(255),
            existing_nullable=False,
        )
