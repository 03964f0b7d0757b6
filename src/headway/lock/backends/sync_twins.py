"""The sync twins of the PostgreSQL, Redlock, etcd and ZooKeeper lock backends.

Each is its async backend run on a private event loop (``blocking``): the same
flow, statements, scripts and rules, for threads. They take what the async
backend takes to make its clients (URLs, hosts, options), never a client or an
engine, because those bind to the loop they first connect on and this loop is the
twin's own. ``close()`` closes what the twin made.

The clients' packages are imported when a twin is made, so this module loads
without the extras.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headway._clock import Clock
from headway.lock.backends.blocking import BlockingLockBackend, BlockingModalLockBackend

if TYPE_CHECKING:
    from sqlalchemy import URL
    from sqlalchemy.ext.asyncio import AsyncEngine

    from headway.lock.backends.etcd.backend import EtcdLockBackend
    from headway.lock.backends.postgres import PostgresLockBackend
    from headway.lock.backends.zookeeper.backend import ZooKeeperLockBackend

__all__ = [
    "SyncEtcdLockBackend",
    "SyncPostgresLockBackend",
    "SyncRedlockBackend",
    "SyncZooKeeperLockBackend",
]


class SyncPostgresLockBackend(BlockingModalLockBackend):
    """``PostgresLockBackend`` for threads: advisory locks on an engine of its own.

    The twin makes its async engine from ``url`` (an async driver:
    ``postgresql+asyncpg://...``) and disposes of it in ``close()``. Each waiting or
    held lease occupies one connection of its pool: size it with the other keyword
    arguments, which go to ``create_async_engine`` (``pool_size``, ``max_overflow``).
    Offers every mode, as the async backend.

    Args:
        url: The database URL, with an async driver (``postgresql+asyncpg``).
        timeout: Bounds each round trip beyond the lock wait itself, in seconds;
            default 2.0.
        clock: The monotonic clock of lease deadlines; default None:
            ``time.monotonic``.

    Raises:
        ValueError: ``url`` is not PostgreSQL's with an installed async driver, or a
            bad ``timeout``.
    """

    backend: PostgresLockBackend

    def __init__(
        self,
        url: str | URL,
        *,
        timeout: float = 2.0,
        clock: Clock | None = None,
        **engine_options: Any,
    ) -> None:
        import sqlalchemy.exc
        from sqlalchemy.ext.asyncio import create_async_engine

        from headway.lock.backends.postgres import PostgresLockBackend

        try:
            engine = create_async_engine(url, **engine_options)
        except (
            sqlalchemy.exc.ArgumentError,
            sqlalchemy.exc.InvalidRequestError,
            ImportError,
        ) as exc:
            raise ValueError(
                "SyncPostgresLockBackend needs a URL with an installed async driver "
                f"(postgresql+asyncpg://...): {exc}"
            ) from exc
        self.engine: AsyncEngine = engine
        super().__init__(PostgresLockBackend(engine, timeout=timeout, clock=clock))

    def waiting(self, resource: str) -> int:
        """How many requests wait in the server's line for ``resource`` (``pg_locks``).

        Args:
            resource: The lock's name.
        """
        return self._loop.run(self.backend.waiting(resource))

    async def _aclose(self) -> None:
        try:
            await super()._aclose()
        finally:
            await self.engine.dispose()


class SyncRedlockBackend(BlockingLockBackend):
    """``RedlockBackend`` for threads: locks on a majority of N independent Redis servers.

    Other keyword arguments go to each ``redis.asyncio.Redis.from_url``.

    Args:
        urls: One ``redis://`` URL per independent server.
        node_timeout: Bounds each request to one node, in seconds (> 0); default 0.05.
        drift_factor: Clock drift allowed for, as a fraction of ``ttl`` (0 to < 1);
            default 0.01.
        retry_delay: The ``(low, high)`` range in seconds of the random pause between
            acquire rounds; default ``(0.05, 0.2)``.
        fencing: Count a fencing token on the nodes; default True.
        clock: The monotonic clock of rounds and lease validity; default None:
            ``time.monotonic``.

    Raises:
        ValueError: As ``RedlockBackend.from_urls``.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        node_timeout: float = 0.05,
        drift_factor: float = 0.01,
        retry_delay: tuple[float, float] = (0.05, 0.2),
        fencing: bool = True,
        clock: Clock | None = None,
        **options: Any,
    ) -> None:
        from headway.lock.backends.redlock import RedlockBackend

        backend = RedlockBackend.from_urls(
            urls, node_timeout=node_timeout, drift_factor=drift_factor,
            retry_delay=retry_delay, fencing=fencing, clock=clock, **options,
        )  # fmt: skip
        super().__init__(backend)

    @classmethod
    def from_urls(cls, urls: Sequence[str], **options: Any) -> SyncRedlockBackend:
        """The constructor under the async backend's name for it.

        Args:
            urls: One ``redis://`` URL per independent server; other keyword arguments
                are the constructor's.
        """
        return cls(urls, **options)


class SyncEtcdLockBackend(BlockingModalLockBackend):
    """``EtcdLockBackend`` for threads: locks on an etcd v3 cluster (JSON gateway).

    Lease TTLs are whole seconds on etcd, at least its minimum (2 s by default).
    Offers every mode, as the async backend.

    Args:
        endpoints: The members' client URLs (a list, or one string with commas);
            default ``"http://127.0.0.1:2379"``.
        timeout: Bounds every call, in seconds; default 2.0.
        namespace: The prefix of every key the locks write; default ``"headway/"``.
        clock: The monotonic clock of lease deadlines and waits; default None:
            ``time.monotonic``.

    Raises:
        ValueError: No endpoint, or a bad ``timeout``.
    """

    backend: EtcdLockBackend

    def __init__(
        self,
        endpoints: str | Sequence[str] = "http://127.0.0.1:2379",
        *,
        timeout: float = 2.0,
        namespace: str = "headway/",
        clock: Clock | None = None,
    ) -> None:
        from headway.lock.backends.etcd.backend import EtcdLockBackend

        backend = EtcdLockBackend(endpoints, timeout=timeout, namespace=namespace, clock=clock)
        super().__init__(backend)


class SyncZooKeeperLockBackend(BlockingModalLockBackend):
    """``ZooKeeperLockBackend`` for threads: locks on a ZooKeeper ensemble, one session.

    The session is the lease; ``close()`` ends it (the server deletes its nodes at once).
    Other keyword arguments go to ``KazooClient`` (``auth_data``, ...). Offers every
    mode, as the async backend.

    Args:
        hosts: Kazoo's connection string (``"zk1:2181,zk2:2181/chroot"``); default
            ``"127.0.0.1:2181"``.
        session_timeout: How long a holder that stopped talking keeps the lock, in
            seconds, and the longest ``ttl`` accepted; default 30.0.
        timeout: Bounds every request, in seconds (> 0); default 2.0.
        prefix: The absolute path every lock lives under; default ``"/headway/locks"``.
        clock: The monotonic clock of lease deadlines and waits; default None:
            ``time.monotonic``.

    Raises:
        ValueError: A bad ``prefix``, ``session_timeout`` or ``timeout``.
    """

    backend: ZooKeeperLockBackend

    def __init__(
        self,
        hosts: str = "127.0.0.1:2181",
        *,
        session_timeout: float = 30.0,
        timeout: float = 2.0,
        prefix: str = "/headway/locks",
        clock: Clock | None = None,
        **options: Any,
    ) -> None:
        from headway.lock.backends.zookeeper.backend import ZooKeeperLockBackend

        backend = ZooKeeperLockBackend(
            hosts, session_timeout=session_timeout, timeout=timeout, prefix=prefix,
            clock=clock, **options,
        )  # fmt: skip
        super().__init__(backend)
