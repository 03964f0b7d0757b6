"""Run headway's Alembic migrations (shipped in the wheel as ``headway/migrations``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, pool

from headway._database import create_engine

__all__ = [
    "DEFAULT_DATABASE_URL",
    "Migrated",
    "alembic_config",
    "downgrade",
    "migrations_path",
    "upgrade",
]

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


@dataclass(frozen=True)
class Migrated:
    """What a migration did: the revision before and after (None: no headway tables),
    and the newest revision there is."""

    before: str | None
    after: str | None
    head: str | None


def _migrate(url: str, step: Callable[[Config, str], None], revision: str) -> Migrated:
    # A URL headway cannot use fails here with advice (ValueError, ImportError) instead
    # of deep inside Alembic's environment; creating the engine does not connect.
    create_engine(url, poolclass=pool.NullPool)
    config = alembic_config(url)
    step(config, revision)
    # migrations/env.py records the revisions it found and left.
    before, after = config.attributes.get("revisions", (None, None))
    return Migrated(before, after, ScriptDirectory.from_config(config).get_current_head())


def upgrade(url: str, revision: str = "head") -> Migrated:
    """Apply headway's migrations to ``url`` up to ``revision`` (blocking)."""
    return _migrate(url, command.upgrade, revision)


def downgrade(url: str, revision: str) -> Migrated:
    """Revert headway's migrations on ``url`` down to ``revision`` (``"base"``: all)."""
    return _migrate(url, command.downgrade, revision)
