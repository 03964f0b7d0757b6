"""Run headway's Alembic migrations (shipped in the wheel as ``headway/migrations``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

__all__ = ["DEFAULT_DATABASE_URL", "alembic_config", "downgrade", "migrations_path", "upgrade"]

#: The embedded default: a SQLite file in the working directory.
DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///headway.sqlite3"


def migrations_path() -> Path:
    """The ``migrations`` directory: inside the installed package, else the source checkout's."""
    packaged = Path(str(resources.files("headway"))) / "migrations"
    if (packaged / "env.py").is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "migrations"
    if (checkout / "env.py").is_file():
        return checkout
    raise FileNotFoundError("headway's migrations are missing from this installation")


def alembic_config(url: str, connection: Connection | None = None) -> Config:
    """An Alembic config for headway's migrations on ``url`` (or an open sync ``connection``)."""
    config = Config()
    config.set_main_option("script_location", str(migrations_path()))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Apply headway's migrations to ``url`` up to ``revision`` (blocking)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Revert headway's migrations on ``url`` down to ``revision`` (``"base"``: all)."""
    command.downgrade(alembic_config(url), revision)
