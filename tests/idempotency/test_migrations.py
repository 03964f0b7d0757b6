"""The shipped migration creates exactly the table the code defines, and reverts cleanly."""

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

from headway import _migrations
from headway.cli import main
from headway.idempotency.table import metadata
from tests.conftest import need

TABLE = "headway_idempotency_records"
VERSION_TABLE = "headway_alembic_version"


def inspect_db(url: str) -> tuple[set[str], list[Any]]:
    """Table names and the autogenerate diff between the database and ``metadata``."""

    def look(conn: sa.Connection) -> tuple[set[str], list[Any]]:
        tables = set(sa.inspect(conn).get_table_names())
        # Only our tables: other tests share the database (the MySQL lock's fence table).
        ours = {
            "version_table": VERSION_TABLE,
            "include_name": lambda name, kind, _: kind != "table" or name in metadata.tables,
        }
        context = MigrationContext.configure(conn, opts=ours)
        diff = compare_metadata(context, metadata)
        return tables, diff

    async def go() -> tuple[set[str], list[Any]]:
        engine = create_async_engine(url)
        async with engine.connect() as conn:
            result = await conn.run_sync(look)
        await engine.dispose()
        return result

    return asyncio.run(go())


def drop_everything(url: str) -> None:
    async def go() -> None:
        engine = create_async_engine(url)
        async with engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)
            await conn.execute(sa.text(f"DROP TABLE IF EXISTS {VERSION_TABLE}"))
        await engine.dispose()

    asyncio.run(go())


@pytest.mark.parametrize(
    "kind",
    [
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ],
)
def test_upgrade_matches_table_then_downgrade(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'migrated.sqlite3'}"
    else:
        url = request.getfixturevalue("postgres_url" if kind == "postgresql" else "mysql_url")
        drop_everything(url)
    assert main(["migrate", url]) == 0
    tables, diff = inspect_db(url)
    assert {TABLE, VERSION_TABLE} <= tables
    assert "alembic_version" not in tables  # never the host app's version table
    assert diff == []
    assert main(["migrate", url, "--downgrade", "--revision", "base"]) == 0
    tables, _ = inspect_db(url)
    assert TABLE not in tables
    _migrations.upgrade(url)  # and up again, as a host app's deploy would
    assert TABLE in inspect_db(url)[0]


def test_migrations_ship_in_the_wheel(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    built = subprocess.run(
        ["uv", "build", "--wheel", "--out-dir", str(tmp_path), str(root)],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        need("a wheel build (uv build)", built.stderr[-300:])
    import zipfile

    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "headway/migrations/env.py" in names
    assert "headway/migrations/versions/0001_idempotency_records.py" in names
    assert "headway/migrations/versions/0002_binary_keys_on_mysql.py" in names


def test_purge_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'p.sqlite3'}"
    _migrations.upgrade(url)
    assert main(["purge", url]) == 0
    assert "purged 0 expired" in capsys.readouterr().out


def test_migrations_path_points_at_the_environment() -> None:
    assert (_migrations.migrations_path() / "env.py").is_file()
    assert sys.modules["headway"].__file__


@pytest.mark.mysql
@pytest.mark.anyio
async def test_binary_keys_keep_the_records_written_before(mysql_url: str) -> None:
    """0002 turns MySQL's key column into VARBINARY; records claimed under 0001 survive."""
    from headway import RecordStore

    await asyncio.to_thread(drop_everything, mysql_url)
    await asyncio.to_thread(_migrations.upgrade, mysql_url, "0001")
    store = RecordStore.from_url(mysql_url)
    try:
        claimed = await store.claim(
            "caller", "Order-1", "f" * 64, fence=3, lease_token="t", lease_ttl=30
        )
        assert claimed.fence == 3
        await asyncio.to_thread(_migrations.upgrade, mysql_url)
        record = await store.get("caller", "Order-1")
        assert record is not None
        assert record.fence == 3
        assert await store.get("caller", "order-1") is None  # a key of its own now
    finally:
        await store.aclose()
