"""Alembic environment for headway's tables.

Run by ``headway migrate URL`` (or ``alembic`` with ``script_location`` pointing
here). The URL comes from ``sqlalchemy.url``; async drivers (asyncpg, aiosqlite,
aiomysql) are driven through ``run_sync``. headway keeps its own version table,
``headway_alembic_version``, so it never touches a host app's ``alembic_version``.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection, pool
from sqlalchemy.ext.asyncio import async_engine_from_config

VERSION_TABLE = "headway_alembic_version"

config = context.config


def _configure(connection: Connection | None = None) -> None:
    if connection is None:
        url = config.get_main_option("sqlalchemy.url")
        context.configure(url=url, version_table=VERSION_TABLE, literal_binds=True)
    else:
        context.configure(connection=connection, version_table=VERSION_TABLE)


def _run(connection: Connection) -> None:
    _configure(connection)
    migration = context.get_context()
    before = migration.get_current_revision()
    with context.begin_transaction():
        context.run_migrations()
    # For ``headway migrate`` to say what it did.
    config.attributes["revisions"] = (before, migration.get_current_revision())


async def _run_async() -> None:
    engine = async_engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    _configure()
    with context.begin_transaction():
        context.run_migrations()
elif (given := config.attributes.get("connection")) is not None:
    _run(given)
else:
    asyncio.run(_run_async())
