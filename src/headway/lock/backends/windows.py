"""Window claims: ``run_once`` on PostgreSQL and MySQL/MariaDB, kept across crashes.

The SQL backends' locks end with their session, so a ``run_once`` runner that was
SIGKILLed would free its window at once, and a later caller of the same window would
run the job again. As ShedLock's JDBC provider does, these backends offer
``WindowClaimBackend`` instead: a row per job in ``headway_job_windows`` says until
when its window is held (``locked_until``, ``locked_at``, ``locked_by``, ``fence``), and
a claim is one statement that succeeds only if the row is missing or its
``locked_until <= now`` (MySQL, without ``RETURNING``: an update, then an insert only
for a job's first claim), *now* being the database's clock (never an instance's, so
skewed instances judge one window alike). A claim holds the window for
``at_most_for``; its end sets ``locked_until`` to ``max(locked_at + at_least_for,
now)``. Nothing is held between the two: no session, no connection, so a runner that
dies keeps the window for ``at_most_for`` and a process that exits keeps it for
``at_least_for``.

The statements are named queries in ``headway/sql/job_windows.sql``; the table is
created on a backend's first claim (``CREATE TABLE IF NOT EXISTS``: it needs the CREATE
privilege, or the table made beforehand with that file's statement). A claim's
statements run on one pooled connection, in one transaction (but MySQL's insert, in one
of its own: see ``claim_steps``), bounded by the backend's ``timeout``. Names longer
than 255 bytes are kept as their first 180 bytes and a SHA-256 (``row_name``), so any
name fits MySQL's key.

The fence is the row's last fence + 1, floored by the database's clock in microseconds
+ 1: it rises per job across claims, and still rises if the row is deleted (while the
clock does not step back). A window claim shares nothing with the advisory lock or
``GET_LOCK`` of the same name: a ``Lock`` on a job's name does not keep ``run_once``
out, nor the reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, ClassVar

from sqlalchemy import Engine, TextClause
from sqlalchemy.ext.asyncio import AsyncEngine

from headway._clock import Clock
from headway.lock.backends.sql_session import LeaseErrors, named_queries
from headway.lock.driver import run_to_end
from headway.lock.lease import Lease, _finite_seconds, check_ttl, new_token

__all__ = ["WINDOW_TABLE", "SyncWindowClaims", "WindowClaims", "holder", "row_name"]

#: The table of job windows, in the engine's database.
WINDOW_TABLE = "headway_job_windows"
_MAX_NAME = 255
#: This host's name as ``locked_by`` shows it (ASCII: MySQL's column is).
_HOST = socket.gethostname().encode("ascii", "replace").decode()[:200]


def row_name(name: str) -> str:
    """The row's name of job ``name``: itself, or, past 255 bytes (UTF-8), its first 180
    bytes' characters and its SHA-256 (so any name fits, and two names never share a row)."""
    encoded = name.encode()
    if len(encoded) <= _MAX_NAME:
        return name
    head = encoded[:180].decode(errors="ignore")  # a character cut in two is dropped
    return f"{head}~{hashlib.sha256(encoded).hexdigest()}"


def holder(token: str) -> str:
    """``locked_by`` of the claim whose lease has ``token``: the token, then the host."""
    return f"{token} {_HOST}"


@dataclass(frozen=True, slots=True)
class Step:
    """One statement of a claim; ``fresh``: commit what came before, run it in a new
    transaction."""

    statement: TextClause
    params: dict[str, Any]
    fresh: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    """What a statement answered: rows matched, and the first row's first value."""

    rowcount: int
    value: Any


def answer(result: Any) -> Answer:
    value = None
    if result.returns_rows:
        row = result.first()
        value = None if row is None else row[0]
    return Answer(int(result.rowcount or 0), value)


def _dialect(engine: Any) -> str:
    return "postgresql" if engine.dialect.name == "postgresql" else "mysql"


def claim_steps(dialect: str, params: dict[str, Any]) -> Generator[Step, Answer, int | None]:
    """A claim's statements: the fence if it was claimed, None if the window is held."""
    queries = named_queries("job_windows.sql")
    if dialect == "postgresql":
        done = yield Step(queries["postgresql_claim"], params)
        return None if done.value is None else int(done.value)
    done = yield Step(queries["mysql_claim"], params)
    if not done.rowcount:
        # Held, or the job's first claim (no row): an insert tells them apart, in a
        # transaction of its own (the update's gap lock on a missing row, kept till its
        # commit, would deadlock two first claims' inserts).
        done = yield Step(queries["mysql_insert"], params, fresh=True)
        if not done.rowcount:
            return None
    # Read in the claim's transaction: its row stays locked till the commit.
    fence = yield Step(queries["mysql_fence"], {"name": params["name"], "by": params["by"]})
    return int(fence.value)


def end_step(dialect: str, lease: Lease, at_least_for: float) -> Step:
    params = {"name": row_name(lease.resource), "by": holder(lease.token), "least": at_least_for}
    return Step(named_queries("job_windows.sql")[f"{dialect}_end"], params)


def _create(dialect: str) -> TextClause:
    return named_queries("job_windows.sql")[f"{dialect}_create"]


class _Claims(LeaseErrors):
    """What both shells share: arguments, leases, errors."""

    clock: Clock
    #: True once this backend made sure the table exists (reset when a claim fails).
    _windows_ready: bool = False
    _unavailable_errors: ClassVar[tuple[type[BaseException], ...]]

    @staticmethod
    def _claim_params(name: str, at_most_for: float) -> tuple[int, str, dict[str, Any]]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a job's name must be a non-empty str, got {name!r}")
        most_ms = check_ttl(at_most_for)
        token = new_token()
        params = {"name": row_name(name), "by": holder(token), "most": most_ms / 1000}
        return most_ms, token, params

    def _lease(self, name: str, token: str, fence: int, sent: float, most_ms: int) -> Lease:
        return Lease(name, token, fence, sent + most_ms / 1000, most_ms / 1000)


class WindowClaims(_Claims):
    """``WindowClaimBackend`` for an async SQL backend (``engine`` an ``AsyncEngine``)."""

    engine: AsyncEngine

    async def claim_window(self, name: str, at_most_for: float) -> Lease | None:
        """Claim job ``name``'s window (see ``WindowClaimBackend.claim_window``).

        Args:
            name: The job's name.
            at_most_for: Seconds the window is held at most.
        """
        most_ms, token, params = self._claim_params(name, at_most_for)
        sent = self.clock()

        async def undo(fence: int | None) -> None:
            if fence is not None:  # claimed as the caller was cancelled: free it again
                lease = self._lease(name, token, fence, sent, most_ms)
                with contextlib.suppress(Exception):
                    await self._run_one(end_step(_dialect(self.engine), lease, 0.0))

        try:
            fence = await run_to_end(self._claim(params), undo)
        except self._unavailable_errors as exc:
            self._windows_ready = False  # the table may have gone: make it again
            raise self._unavailable(exc) from exc
        return None if fence is None else self._lease(name, token, fence, sent, most_ms)

    async def _claim(self, params: dict[str, Any]) -> int | None:
        dialect = _dialect(self.engine)
        if not self._windows_ready:
            with contextlib.suppress(*self._unavailable_errors):  # made elsewhere: fine
                await self._run_one(Step(_create(dialect), {}))
            self._windows_ready = True
        async with asyncio.timeout(self.timeout), self.engine.connect() as conn:
            steps = claim_steps(dialect, params)
            step = next(steps)
            while True:
                if step.fresh:
                    await conn.commit()
                result = await conn.execute(step.statement, step.params)
                try:
                    step = steps.send(answer(result))
                except StopIteration as stop:
                    await conn.commit()
                    return stop.value  # type: ignore[no-any-return]

    async def end_window(self, lease: Lease, at_least_for: float) -> bool:
        """End the claim ``lease`` (see ``WindowClaimBackend.end_window``).

        Args:
            lease: A lease ``claim_window`` returned.
            at_least_for: Seconds after the claim the window stays held.
        """
        least = _finite_seconds("at_least_for", at_least_for)
        try:
            done = await run_to_end(self._run_one(end_step(_dialect(self.engine), lease, least)))
        except self._unavailable_errors as exc:
            raise self._unavailable(exc) from exc
        return done.rowcount > 0

    async def _run_one(self, step: Step) -> Answer:
        async with asyncio.timeout(self.timeout), self.engine.begin() as conn:
            return answer(await conn.execute(step.statement, step.params))


class SyncWindowClaims(_Claims):
    """``SyncWindowClaimBackend`` for a sync SQL backend (``engine`` an ``Engine``); each
    statement is bounded by the backend's ``_execute``."""

    engine: Engine

    def _execute(
        self, conn: Any, statement: TextClause, params: dict[str, Any], seconds: float
    ) -> Any:
        raise NotImplementedError

    def claim_window(self, name: str, at_most_for: float) -> Lease | None:
        """As ``WindowClaims.claim_window``, blocking.

        Args:
            name: The job's name.
            at_most_for: Seconds the window is held at most.
        """
        most_ms, token, params = self._claim_params(name, at_most_for)
        sent = self.clock()
        try:
            fence = self._claim(params)
        except self._unavailable_errors as exc:
            self._windows_ready = False
            raise self._unavailable(exc) from exc
        return None if fence is None else self._lease(name, token, fence, sent, most_ms)

    def _claim(self, params: dict[str, Any]) -> int | None:
        dialect = _dialect(self.engine)
        if not self._windows_ready:
            with contextlib.suppress(*self._unavailable_errors):
                self._run_one(Step(_create(dialect), {}))
            self._windows_ready = True
        steps = claim_steps(dialect, params)
        with self.engine.connect() as conn:
            step = next(steps)
            while True:
                if step.fresh:
                    conn.commit()
                result = self._execute(conn, step.statement, step.params, self.timeout)
                try:
                    step = steps.send(answer(result))
                except StopIteration as stop:
                    conn.commit()
                    return stop.value  # type: ignore[no-any-return]

    def end_window(self, lease: Lease, at_least_for: float) -> bool:
        """As ``WindowClaims.end_window``, blocking.

        Args:
            lease: A lease ``claim_window`` returned.
            at_least_for: Seconds after the claim the window stays held.
        """
        least = _finite_seconds("at_least_for", at_least_for)
        try:
            done = self._run_one(end_step(_dialect(self.engine), lease, least))
        except self._unavailable_errors as exc:
            raise self._unavailable(exc) from exc
        return done.rowcount > 0

    def _run_one(self, step: Step) -> Answer:
        with self.engine.begin() as conn:
            return answer(self._execute(conn, step.statement, step.params, self.timeout))
