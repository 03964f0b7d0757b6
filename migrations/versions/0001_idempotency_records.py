"""Idempotency records.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = ("headway",)
depends_on = None

TABLE = "headway_idempotency_records"


def upgrade() -> None:
    timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    op.create_table(
        TABLE,
        sa.Column("scope", sa.String(64), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("lease_token", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", timestamp, nullable=True),
        sa.Column("response_status", sa.Integer, nullable=True),
        sa.Column("response_headers", sa.JSON, nullable=True),
        sa.Column(
            "response_body",
            sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"),
            nullable=True,
        ),
        sa.Column("created_at", timestamp, nullable=False),
        sa.Column("expires_at", timestamp, nullable=False),
        sa.PrimaryKeyConstraint("scope", "key", name="pk_headway_idempotency_records"),
        sa.CheckConstraint("status IN ('PROCESSING', 'COMPLETED')", name="ck_headway_idem_status"),
    )
    op.create_index("ix_headway_idempotency_records_expires_at", TABLE, ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_headway_idempotency_records_expires_at", table_name=TABLE)
    op.drop_table(TABLE)
