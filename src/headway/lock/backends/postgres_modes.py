"""Read-write locks and semaphores on PostgreSQL: ``PostgresLockBackend.for_mode``.

A lease is still one pooled connection in an open transaction, its TTL the
session's ``idle_in_transaction_session_timeout`` (see ``postgres.py``); the
statements are named queries in ``headway/sql/lock_modes.sql``.

**Read-write** (``_ReadWriteView``): readers take ``pg_advisory_xact_lock_shared``,
writers ``pg_advisory_xact_lock``, on the resource's read-write key (not the
exclusive lock's). The server's lock manager is the queue: a request that
conflicts with a *waiting* one waits behind it (a waiting writer stops later
readers), and a release wakes every waiter at the head that now fits (readers
behind a writer enter together). The fence is ``txid_current()`` taken after the
grant, so a writer's exceeds every earlier holder's and a reader's every earlier
writer's; readers granted together take theirs in the order they run, which need
not be their arrival order (docs/decisions/lock.md).

**Semaphores** (``_PermitView``): PostgreSQL has no counted lock, so a permit is
one of the *slot* locks ``(class, i)`` (two-int advisory locks; a holder past a
lowered capacity keeps its slot), and the line is a *gate*, a session-level
advisory lock: requests wait for the gate in the lock manager, first come first
served, and the one holding it takes a free slot if fewer than ``n`` slots are
held, then takes its fence (so fences rise in arrival order) and gives the gate
up, all in one statement. A gate holder that finds no room is the head of the
line: it keeps the gate, LISTENs on the semaphore's channel, ends its
transaction, and waits for a NOTIFY, which every release sends in the commit that
frees its slot. A crashed holder sends nothing: its session ends when its lease
does, so every holder shows its TTL as a shared lock ``(TTL_CLASS, ttl_ms)``, and
the head also wakes when the soonest lease can run out (from ``pg_locks`` and
``pg_stat_activity``). While it waits, ``idle_session_timeout`` bounds the head's
session to its own deadline, so a frozen head frees the gate then. A cancelled
or timed-out head ends its session: gate, LISTEN and settings go with it.
Needs PostgreSQL 14 (``idle_session_timeout``), and, for the soonest lease,
``pg_stat_activity`` rows of the holders' sessions (same role, or
``pg_read_all_stats``); without them the head looks again a TTL after it last
looked.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from headway.lock.backends.postgres import PostgresLockBackend, _ms
from headway.lock.backends.postgres_inspect import Target, session_label
from headway.lock.backends.sql_session import Held as _Held
from headway.lock.backends.sql_session import discard as _discard
from headway.lock.contract import LockBackend
from headway.lock.lease import Lease
from headway.lock.modes import LockMode

__all__ = ["TTL_CLASS", "family_key", "for_mode", "queries", "slot_class", "waiting_sql"]

#: The class of the shared locks ``(TTL_CLASS, ttl_ms)`` by which permit holders show their TTL.
TTL_CLASS = 0x68776179  # "hway"
_INT4 = (1 << 31) - 1
#: A head that finds the soonest lease already run out (its session is being ended)
#: looks again after this long.
_OVERDUE_S = 0.005


@cache
def queries() -> dict[str, TextClause]:
    """The named queries of ``headway/sql/lock_modes.sql``, by name."""
    source = (resources.files("headway") / "sql" / "lock_modes.sql").read_text("utf-8")
    parts = re.split(r"^-- name: (\w+)\n", source, flags=re.MULTILINE)
    return {name: text(body.strip()) for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def waiting_sql() -> TextClause:
    """The statement counting the requests in a key's line (``lock_modes.sql``: waiting)."""
    return queries()["waiting"]


def family_key(family: str, resource: str) -> int:
    """The signed 64-bit advisory key of ``resource``'s read-write lock or semaphore gate."""
    person = b"headway." + family.encode()
    digest = hashlib.blake2b(resource.encode(), digest_size=8, person=person).digest()
    return int.from_bytes(digest, "big", signed=True)


def slot_class(resource: str) -> int:
    """The 31-bit class of ``resource``'s semaphore slots ``(class, i)``, never ``TTL_CLASS``."""
    digest = hashlib.blake2b(resource.encode(), digest_size=4, person=b"headway.permits")
    cls = int.from_bytes(digest.digest(), "big") & _INT4
    return cls ^ 1 if cls == TTL_CLASS else cls


def for_mode(backend: PostgresLockBackend, mode: LockMode) -> LockBackend:
    """``backend`` holding resources in ``mode``; the views share its engine and leases."""
    if mode.kind == "permits":
        return _PermitView(backend, mode)
    return _ReadWriteView(backend, mode)


class _View(PostgresLockBackend):
    """A ``PostgresLockBackend`` sharing ``parent``'s engine, clock and leases."""

    def __init__(self, parent: PostgresLockBackend, mode: LockMode) -> None:
        self.engine, self.timeout, self.clock = parent.engine, parent.timeout, parent.clock
        self._held = parent._held  # so ``parent.aclose()`` ends these leases too
        self.mode = mode

    def __repr__(self) -> str:
        return f"<postgres lock backend, {self.mode.kind} mode>"


class _ReadWriteView(_View):
    """Readers share the read-write key, writers hold it alone (the server queues both)."""

    def __init__(self, parent: PostgresLockBackend, mode: LockMode) -> None:
        super().__init__(parent, mode)
        if mode.kind == "read":
            self._wait_sql, self._try_sql = queries()["read_wait"], queries()["read_try"]

    def _key(self, resource: str) -> int:
        return family_key("rw", resource)

    def _target(self, resource: str) -> Target:
        key = self._key(resource)
        return Target(key, 1, key, False, lambda exclusive: "write" if exclusive else "read")


@dataclass
class _Permit(_Held):
    channel: str = ""
    heard: Callable[..., None] | None = None  # its LISTEN callback, if it waited at the head


class _PermitView(_View):
    """One of ``mode.capacity`` permits: a gate for the line, a slot lock per holder."""

    _touch_sql = queries()["permit_touch"]

    def __init__(self, parent: PostgresLockBackend, mode: LockMode) -> None:
        super().__init__(parent, mode)
        # A granted head's LISTEN callback, until ``acquire`` files it with the lease.
        self._heads: dict[AsyncConnection, Callable[..., None]] = {}

    def _key(self, resource: str) -> int:
        return family_key("gate", resource)

    def _target(self, resource: str) -> Target:
        # The holders are the slots' (two-int locks of the class); the line, the gate's.
        return Target(slot_class(resource), 2, self._key(resource), True, lambda _: "permits")

    def _touch_params(self, ttl_ms: int) -> dict[str, Any]:
        return {"ttl": f"{ttl_ms}ms", "ttl_cls": TTL_CLASS, "ttl_ms": min(ttl_ms, _INT4)}

    def _params(self, resource: str, ttl_ms: int) -> dict[str, Any]:
        return {
            **self._touch_params(ttl_ms),
            "key": self._key(resource),
            "cls": slot_class(resource),
            "n": self.mode.capacity,
            "app": session_label(),
        }

    async def waiting(self, resource: str) -> int:
        """How many requests wait in line for ``resource``'s permits, the head included."""
        async with self.engine.connect() as conn:
            params = {"key": self._key(resource), "gate_counts": True}
            return int((await conn.execute(waiting_sql(), params)).scalar_one())

    async def _request(
        self, conn: AsyncConnection, resource: str, ttl_ms: int, wait: float
    ) -> int | None:
        """Take the gate and a slot; without room, wait at the head of the line."""
        end = self.clock() + wait
        params = self._params(resource, ttl_ms)
        enter = {**params, "wait": _ms(wait) if wait > 0 else "0", "lead": wait > 0}
        result = await self._bounded(
            conn.execute(queries()["permit_enter"], enter), wait + self.timeout
        )
        fence, gate = result.one()
        if fence is None and gate:
            fence = await self._lead(conn, params, end)
        return None if fence is None else int(fence)

    async def _lead(self, conn: AsyncConnection, params: dict[str, Any], end: float) -> int | None:
        """Wait at the head of the line (holding the gate) until a slot is taken or ``end``."""
        channel = f"headway_permits_{params['cls']}"
        woken = asyncio.Event()

        def heard(*_: object) -> None:
            woken.set()

        await self._bounded(
            conn.commit(), self.timeout
        )  # notifications arrive between transactions
        listener = (await conn.get_raw_connection()).driver_connection
        assert listener is not None
        # LISTEN before the next look: a release committed after it is heard.
        await self._bounded(listener.add_listener(channel, heard), self.timeout)
        while (left := end - self.clock()) > 0:
            woken.clear()
            retry = {**params, "idle": _ms(left + self.timeout)}
            result = await self._bounded(
                conn.execute(queries()["permit_retry"], retry), self.timeout
            )
            fence, _, soonest_ms = result.one()
            if fence is not None:
                # UNLISTEN at the release: a round trip now would hand the lease late.
                self._heads[conn] = heard
                return int(fence)
            await self._bounded(conn.commit(), self.timeout)
            pause = left if soonest_ms is None else max(soonest_ms / 1000, _OVERDUE_S)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, pause)):
                    await woken.wait()
        return None

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        lease = await super().acquire(resource, ttl, timeout)
        held = self._held[lease.token]
        channel = f"headway_permits_{slot_class(resource)}"
        heard = self._heads.pop(held.conn, None)
        self._held[lease.token] = _Permit(held.conn, held.busy, channel, heard)
        return lease

    async def _give_back(self, conn: AsyncConnection) -> None:
        # A refused request may have been the head: its session keeps a gate, a LISTEN
        # and an idle bound, so it does not go back to the pool.
        await _discard(conn)

    async def _end(self, held: _Held) -> None:
        """Commit (not roll back) the lease's transaction, so its NOTIFY wakes the head."""
        assert isinstance(held, _Permit)
        async with held.busy:
            try:
                if held.heard is not None:  # it waited at the head: UNLISTEN as it commits
                    listener = (await held.conn.get_raw_connection()).driver_connection
                    assert listener is not None
                    unlisten = listener.remove_listener(held.channel, held.heard)
                    await self._bounded(unlisten, self.timeout)
                statement = held.conn.execute(
                    queries()["permit_release"], {"channel": held.channel}
                )
                await self._bounded(statement, self.timeout)
                await self._bounded(held.conn.commit(), self.timeout)
            except BaseException:
                await _discard(held.conn)
                raise
            await held.conn.close()
