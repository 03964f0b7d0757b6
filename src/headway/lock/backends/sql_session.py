"""What the SQL lock backends share: a lease is one pooled session held open.

``PostgresLockBackend`` (a transaction holding an advisory lock) and
``MySQLLockBackend`` (a session holding ``GET_LOCK``) keep each lease's connection out
of the pool until it is released; the session ends, and its lock with it, when the
holder stops talking for longer than the TTL. ``SessionLockBackend`` holds what they do
alike with those sessions: the table of held ones, the renewal (one statement that
restarts the server's idle timer), the release, and the ending of a session that
cannot be trusted. Each backend keeps its own statements, errors and the lock request
itself, as a few small methods and attributes. ``LeaseErrors`` is the errors' wording,
shared with ``SyncMySQLLockBackend`` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, ClassVar, Generic, TypeVar

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from headway._clock import Clock
from headway._errors import BackendUnavailable, LockNotAcquired, LockNotOwned
from headway.lock.driver import run_to_end
from headway.lock.lease import Lease, check_ttl

__all__: list[str] = []

T = TypeVar("T")


@cache
def named_queries(file: str) -> dict[str, TextClause]:
    """The named queries of ``headway/sql/<file>``: each "-- name: NAME" line starts one."""
    source = (resources.files("headway") / "sql" / file).read_text("utf-8")
    parts = re.split(r"^-- name: (\w+)\n", source, flags=re.MULTILINE)
    return {name: text(body.strip()) for name, body in zip(parts[1::2], parts[2::2], strict=True)}


@dataclass
class Held:
    """A lease's session: its connection, out of the pool until the lease ends."""

    conn: AsyncConnection
    # One connection runs one statement at a time: extend and release queue here.
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)


H = TypeVar("H", bound=Held)


async def discard(conn: AsyncConnection) -> None:
    """Close the connection for good: the session ends, and its locks with it."""
    with contextlib.suppress(Exception):
        await conn.invalidate()
    with contextlib.suppress(Exception):
        await conn.close()


class LeaseErrors:
    """The errors a SQL lock backend raises, worded alike (no statements run here)."""

    #: The backend's name, as ``BackendUnavailable.backend``.
    name: str
    #: The server's name in messages.
    _server: ClassVar[str]
    timeout: float

    def _unavailable(self, exc: BaseException) -> BackendUnavailable:
        return BackendUnavailable(
            f"{self._server} failed or did not answer within {self.timeout:g} s: "
            f"{type(exc).__name__}: {exc}",
            backend=self.name,
        )

    def _not_acquired(self, resource: str, timeout: float) -> LockNotAcquired:
        return LockNotAcquired(
            f"lock {resource!r} not acquired within {timeout:g} s", resource=resource
        )

    def _not_owned(self, lease: Lease, what: str, why: str = "") -> LockNotOwned:
        return LockNotOwned(
            f"cannot {what} lock {lease.resource!r}: the lease (fence {lease.fence}) is "
            f"no longer held{why}",
            resource=lease.resource,
        )

    def _bound(self, lease: Lease, sent: float) -> float:
        """How long a renewal may take: past the lease's deadline the server may end the
        session anyway, so a touch that cannot answer by then counts as lost."""
        left = lease.deadline - sent
        return min(self.timeout, left) if left > 0 else self.timeout


class SessionLockBackend(LeaseErrors, Generic[H]):
    """The held sessions of an async SQL lock backend: renewal, release, closing.

    A backend sets ``_touch_sql`` (the renewal's statement, with ``_touch_params``),
    ``_unavailable_errors``, and says how a session is put back: ``_reset`` (it holds no
    lock) and ``_unlock`` (it holds the lease's).
    """

    engine: AsyncEngine
    clock: Clock
    _held: dict[str, H]
    #: Errors that mean "the server is not answering (or the session is gone)".
    _unavailable_errors: ClassVar[tuple[type[BaseException], ...]]
    #: One cheap statement that restarts the server's idle timer and sets the new TTL.
    _touch_sql: ClassVar[TextClause]

    def _touch_params(self, ttl_ms: int) -> dict[str, Any]:
        raise NotImplementedError

    def _reset(self, conn: AsyncConnection) -> Awaitable[object]:
        """Put back the session of a request that holds no lock (before the pool has it)."""
        raise NotImplementedError

    def _unlock(self, held: H) -> Awaitable[object]:
        """Free the lease's lock and put its session back (before the pool has it)."""
        raise NotImplementedError

    async def _bounded(self, aw: Awaitable[T], seconds: float) -> T:
        async with asyncio.timeout(seconds):
            return await aw

    async def _give_back(self, conn: AsyncConnection) -> None:
        """Put back the session of a request that holds no lock and return it to the pool."""
        try:
            await self._bounded(self._reset(conn), self.timeout)
        except self._unavailable_errors:
            await discard(conn)
        else:
            await conn.close()

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        """Renew ``lease`` for ``ttl`` s from now; ``LockNotOwned`` if its session ended."""
        ttl_ms = check_ttl(ttl)
        held = self._held.get(lease.token)
        if held is None:
            raise self._not_owned(lease, "extend")
        async with held.busy:
            if self._held.get(lease.token) is not held:
                raise self._not_owned(lease, "extend")
            sent = self.clock()
            try:
                # Shielded: a statement abandoned halfway would leave the session unusable.
                await run_to_end(self._touch(lease.token, held, ttl_ms, self._bound(lease, sent)))
            except self._unavailable_errors as exc:
                why = f" ({type(exc).__name__}: its session ended or did not answer)"
                raise self._not_owned(lease, "extend", why) from exc
        return lease.renewed(ttl_ms, sent)

    async def _touch(self, token: str, held: H, ttl_ms: int, bound: float) -> None:
        try:
            statement = held.conn.execute(self._touch_sql, self._touch_params(ttl_ms))
            await self._bounded(statement, bound)
        except BaseException:
            # A session that failed a statement cannot be trusted to hold anything:
            # end it, so the lock is freed for certain.
            self._held.pop(token, None)
            await discard(held.conn)
            raise

    async def release(self, lease: Lease) -> None:
        """Release ``lease`` (shielded from cancellation); ``LockNotOwned`` if it had lapsed."""
        held = self._held.pop(lease.token, None)
        if held is None:
            raise self._not_owned(lease, "release")
        try:
            await run_to_end(self._end(held))
        except TimeoutError as exc:
            # The session was closed from our side: the server frees the lock when it notices.
            raise self._unavailable(exc) from exc
        except self._unavailable_errors as exc:
            raise self._not_owned(lease, "release", " (its session had ended)") from exc

    async def _end(self, held: H) -> None:
        async with held.busy:
            try:
                await self._bounded(self._unlock(held), self.timeout)
            except BaseException:
                await discard(held.conn)
                raise
            await held.conn.close()

    async def aclose(self) -> None:
        """Release every lease still held (their sessions end; the engine stays yours)."""
        held, self._held = list(self._held.values()), {}
        for h in held:
            await run_to_end(discard(h.conn))
