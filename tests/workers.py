"""Each pytest-xdist worker gets services of its own, so workers never meet.

The suite runs with ``pytest -n …`` (the README's command). A worker may FLUSHALL or
FUNCTION FLUSH its Redis and create and drop tables, so each gets a private
redis-server on a free loopback port and its own PostgreSQL and MariaDB databases
(``<database>_<worker>``, created afresh from the configured ones). etcd and ZooKeeper
tests already keep to a unique namespace or path prefix per test, so they share the
configured servers. The URLs are written back to the environment, where the tests'
subprocesses read them.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from tests.servers import RedisServers

__all__ = ["Isolated"]


class Isolated:
    """The services of one worker; ``close`` stops its redis-server."""

    def __init__(self, worker: str, redis_url: str, postgres_url: str, mysql_url: str) -> None:
        self.worker = worker
        self.redis_url = redis_url
        self.postgres_url = _own_database(postgres_url, worker, _recreate_postgres)
        self.mysql_url = _own_database(mysql_url, worker, _recreate_mysql)
        self._servers: RedisServers | None = None
        binary = shutil.which("redis-server")
        if binary is not None:  # without one, the configured Redis is shared (and skips say why)
            self._servers = RedisServers(binary, Path(tempfile.mkdtemp(prefix="headway-worker-")))
            self.redis_url = self._servers.start().url

    def close(self) -> None:
        if self._servers is not None:
            self._servers.stop_all()
            shutil.rmtree(self._servers.workdir, ignore_errors=True)


def _own_database(url: str, worker: str, recreate: Callable[[sa.URL, str], None]) -> str:
    """``url`` with the worker's database, recreated; ``url`` unchanged if unreachable."""
    parsed = sa.make_url(url)
    name = f"{parsed.database}_{worker}"
    try:
        recreate(parsed, name)
    except OSError:
        return url  # the server is down: the fixtures skip (or fail in CI) with the reason
    return parsed.set(database=name).render_as_string(hide_password=False)


def _recreate_postgres(parsed: sa.URL, name: str) -> None:
    import asyncpg

    async def run() -> None:
        connection = await asyncpg.connect(
            host=parsed.host, port=parsed.port or 5432, user=parsed.username,
            password=parsed.password, database=parsed.database, timeout=5,
        )  # fmt: skip
        try:
            await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await connection.execute(f'CREATE DATABASE "{name}"')
        finally:
            await connection.close()

    asyncio.run(run())


def _recreate_mysql(parsed: sa.URL, name: str) -> None:
    url = parsed.set(drivername="mysql+pymysql", database=None)
    engine = sa.create_engine(url, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
            connection.exec_driver_sql(f"CREATE DATABASE `{name}`")
    except sa.exc.OperationalError as exc:
        raise OSError(str(exc)) from exc
    finally:
        engine.dispose()
