"""MySQLLockBackend against a real MariaDB/MySQL server (aiomysql): grants, TTLs, fences, names."""

from __future__ import annotations

import asyncio
import time
import uuid

import aiomysql
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from headway import BackendUnavailable, Lock, LockLost, LockNotAcquired, LockNotOwned
from headway.lock.backends.mysql import FENCE_TABLE, MySQLLockBackend, lock_name
from tests.lock.backends.mysql.sessions import (
    eventually,
    free,
    holder,
    name_of,
    sessions_out,
    waiters,
    waiting,
)

pytestmark = [pytest.mark.anyio, pytest.mark.mysql]


async def test_acquire_release(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    before = time.monotonic()
    lease = await backend.acquire(resource, ttl=5, timeout=0)
    assert (lease.resource, lease.ttl) == (resource, 5.0)
    assert before + 5 <= lease.deadline <= time.monotonic() + 5
    assert await holder(engine, name_of(backend, resource)) is not None
    with pytest.raises(LockNotAcquired) as caught:
        await backend.acquire(resource, ttl=5, timeout=0)
    assert caught.value.resource == resource
    await backend.release(lease)
    assert await holder(engine, name_of(backend, resource)) is None
    again = await backend.acquire(resource, ttl=5, timeout=0)
    assert again.fence > lease.fence
    with pytest.raises(LockNotOwned):
        await backend.release(lease)
    with pytest.raises(LockNotOwned):
        await backend.extend(lease, 5)
    await backend.release(again)
    assert sessions_out(engine) == 0


async def test_pooled_sessions_get_their_settings_back(mysql_url: str, resource: str) -> None:
    engine = create_async_engine(mysql_url, pool_size=2, max_overflow=0)
    read = sa.text(
        "SELECT CONNECTION_ID(), @@session.autocommit, @@session.wait_timeout,"
        " @@session.time_zone, LAST_INSERT_ID()"
    )

    async def both() -> set[tuple[object, ...]]:
        async with engine.connect() as one, engine.connect() as two:
            return {tuple((await c.execute(read)).one()) for c in (one, two)}

    try:
        async with engine.connect() as conn:  # a session whose LAST_INSERT_ID is not 0
            await conn.execute(sa.text("SELECT LAST_INSERT_ID(42)"))
        before = await both()
        backend = MySQLLockBackend(engine)
        lease = await backend.acquire(resource, ttl=1, timeout=0)
        with pytest.raises(LockNotAcquired):  # a refused attempt gives its session back too
            await backend.acquire(resource, ttl=1, timeout=0.1)
        await backend.release(lease)
        assert await both() == before  # the same two sessions, as they were
    finally:
        await engine.dispose()


async def test_timeout_raises_and_leaves_nothing(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    lease = await backend.acquire(resource, ttl=5, timeout=0)
    start = time.monotonic()
    with pytest.raises(LockNotAcquired, match=r"within 0\.3 s"):
        await backend.acquire(resource, ttl=5, timeout=0.3)
    assert 0.25 < time.monotonic() - start < 2  # the server honours fractions of a second
    assert await waiters(engine, name_of(backend, resource)) == 0
    assert sessions_out(engine) == 1  # the holder's session; the waiter's went back
    await backend.release(lease)


@pytest.mark.parametrize("first_call", ["extend", "release"])
async def test_idle_holder_loses_the_lock(
    backend: MySQLLockBackend, resource: str, first_call: str
) -> None:
    stale = await backend.acquire(resource, ttl=1, timeout=0)
    # The server closes the idle holder's session after its wait_timeout; the waiter gets in.
    fresh = await backend.acquire(resource, ttl=2, timeout=10)
    assert 0.9 < time.monotonic() - (stale.deadline - 1) < 5
    # It waited about 1 s, more than a tenth of its TTL: its deadline restarts after the grant.
    assert fresh.remaining() > 1.8
    assert fresh.fence > stale.fence
    first = backend.extend(stale, 1) if first_call == "extend" else backend.release(stale)
    with pytest.raises(LockNotOwned, match="no longer held"):
        await first
    for call in (backend.extend(stale, 1), backend.release(stale)):
        with pytest.raises(LockNotOwned):
            await call
    await backend.extend(fresh, 1)
    await backend.release(fresh)


async def test_a_sub_second_ttl_is_held_a_whole_second_on_the_server(
    backend: MySQLLockBackend, resource: str
) -> None:
    # Why the shared suite's "short_ttl" tests do not run over this backend.
    lease = await backend.acquire(resource, ttl=0.3, timeout=0)
    assert lease.ttl == 0.3
    await asyncio.sleep(0.5)
    assert lease.remaining() <= 0  # the holder's own view: run out
    with pytest.raises(LockNotAcquired):  # the server's: wait_timeout is 1 s
        await backend.acquire(resource, ttl=1, timeout=0)
    after = await backend.acquire(resource, ttl=1, timeout=5)
    assert after.fence > lease.fence
    await backend.release(after)


async def test_extend_restarts_and_resets_the_ttl(backend: MySQLLockBackend, resource: str) -> None:
    lease = await backend.acquire(resource, ttl=2.0, timeout=0)
    for _ in range(3):  # 2.4 s in all, longer than the TTL, but never idle that long
        await asyncio.sleep(0.8)
        lease = await backend.extend(lease, 2.0)
    with pytest.raises(LockNotAcquired):
        await backend.acquire(resource, ttl=1, timeout=0)
    lease = await backend.extend(lease, 5)
    assert lease.ttl == 5.0
    await asyncio.sleep(2.5)  # idle longer than the old TTL, shorter than the new one
    lease = await backend.extend(lease, 3)
    await backend.release(lease)


async def test_fences_rise_across_a_lost_or_restored_counter(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    name = name_of(backend, resource)

    async def cycle() -> int:
        lease = await backend.acquire(resource, ttl=5, timeout=0)
        await backend.release(lease)
        return lease.fence

    async def run(statement: str) -> None:
        async with engine.begin() as conn:
            await conn.execute(sa.text(statement), {"name": name})

    first = await cycle()
    # Floored by the server's clock in microseconds: about now, in µs since the epoch.
    assert abs(first / 1e6 - time.time()) < 60
    second = await cycle()
    await run(f"UPDATE {FENCE_TABLE} SET fence = 1 WHERE name = :name")  # an old backup
    third = await cycle()
    await run(f"DELETE FROM {FENCE_TABLE} WHERE name = :name")  # the row lost
    fourth = await cycle()
    await run(f"DROP TABLE {FENCE_TABLE}")  # the table lost: made again on first use
    fifth = await cycle()
    # A counter ahead of the clock (grants faster than a microsecond, a clock set back):
    # the counter decides.
    await run(f"UPDATE {FENCE_TABLE} SET fence = 9000000000000000000 WHERE name = :name")
    sixth = await cycle()
    assert first < second < third < fourth < fifth < sixth == 9000000000000000001
    await run(f"DELETE FROM {FENCE_TABLE} WHERE name = :name")


async def test_the_fence_is_taken_after_the_grant(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    first = await backend.acquire(resource, ttl=10, timeout=0)
    waiter = asyncio.ensure_future(backend.acquire(resource, ttl=10, timeout=10))
    await eventually(waiting(engine, name_of(backend, resource)))
    await asyncio.sleep(0.05)
    meanwhile = time.time()
    await asyncio.sleep(0.05)
    await backend.release(first)
    second = await waiter
    # Floored by the clock read after the grant, not when the waiter's statement began.
    assert second.fence / 1e6 > meanwhile
    await backend.release(second)


async def test_the_grant_and_its_fence_are_one_round_trip(
    backend: MySQLLockBackend, resource: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # aiomysql's connections take several statements in one query: the fence's write
    # travels with the grant's SET, and the server runs it once the wait has ended.
    await backend.release(await backend.acquire(resource, ttl=5, timeout=0))  # table made
    sent: list[str] = []
    send = aiomysql.Connection._execute_command

    async def counted(self: aiomysql.Connection, command: int, sql: str) -> None:
        sent.append(sql if isinstance(sql, str) else sql.decode(errors="replace"))
        await send(self, command, sql)

    monkeypatch.setattr(aiomysql.Connection, "_execute_command", counted)
    lease = await backend.acquire(resource, ttl=5, timeout=0)
    monkeypatch.undo()
    [grant] = [sql for sql in sent if "GET_LOCK" in sql or FENCE_TABLE in sql]
    assert "GET_LOCK" in grant
    assert f"INSERT INTO {FENCE_TABLE}" in grant
    await backend.release(lease)


@pytest.mark.parametrize(
    "hostile",
    [
        "Orders/ABC",
        "x" * 10_000,
        "quote ' double \" backslash \\ percent % colon :name",
        "nul \0 and newline \n and tab \t",
        "'); DROP TABLE headway_lock_fences; --",
        "unicodé ☃ 𝄞 مرحبا",
        "",
    ],
)
async def test_any_resource_name_is_one_lock(
    backend: MySQLLockBackend, engine: AsyncEngine, hostile: str
) -> None:
    name = name_of(backend, hostile)
    assert len(name) == 64
    assert name == name.lower()
    lease = await backend.acquire(hostile, ttl=5, timeout=0)
    assert await holder(engine, name) is not None
    with pytest.raises(LockNotAcquired):
        await backend.acquire(hostile, ttl=5, timeout=0)
    lease = await backend.extend(lease, 5)
    await backend.release(lease)
    assert await holder(engine, name) is None
    again = await backend.acquire(hostile, ttl=5, timeout=0)
    assert again.fence > lease.fence
    await backend.release(again)


async def test_names_differing_in_case_are_different_locks(backend: MySQLLockBackend) -> None:
    # MySQL compares lock names without case (MariaDB 10.11 does not); the hashes never meet.
    suffix = uuid.uuid4().hex
    upper = await backend.acquire(f"Orders/{suffix}", ttl=5, timeout=0)
    lower = await backend.acquire(f"orders/{suffix}", ttl=5, timeout=0)
    await backend.release(upper)
    await backend.release(lower)


def test_lock_name() -> None:
    names = {lock_name(f"r{i}", "db") for i in range(1000)}
    assert len(names) == 1000
    assert all(len(n) == 64 and n.startswith("headway:") for n in names)
    # Scoped by database, as PostgreSQL's advisory locks are: two apps on one server.
    assert lock_name("r1", "db") == lock_name("r1", "db") != lock_name("r1", "other")


async def test_waiters_are_granted_in_arrival_order(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    # Not promised by the server's documentation; what its metadata-lock queue does.
    name = name_of(backend, resource)
    first = await backend.acquire(resource, ttl=10, timeout=0)
    order: list[int] = []

    async def waiter(i: int) -> None:
        lease = await backend.acquire(resource, ttl=10, timeout=30)
        order.append(i)
        await asyncio.sleep(0.01)
        await backend.release(lease)

    tasks = []
    for i in range(6):
        tasks.append(asyncio.ensure_future(waiter(i)))
        await eventually(waiting(engine, name, i + 1))
    await backend.release(first)
    await asyncio.gather(*tasks)
    assert order == list(range(6))


async def test_a_deadlock_is_lock_not_acquired(
    mysql_url: str, engine: AsyncEngine, resource: str
) -> None:
    # The backend's sessions hold one lock each and wait holding none, so they never
    # deadlock among themselves. A pooled session that user code left holding a lock
    # can: the server detects the cycle and refuses the request that closes it.
    other_lock = f"hw-test-{uuid.uuid4().hex}"
    shared = create_async_engine(mysql_url, pool_size=1, max_overflow=0)
    foreign = create_async_engine(mysql_url, poolclass=NullPool)
    backend = MySQLLockBackend(shared)
    name = name_of(backend, resource)
    try:
        async with shared.connect() as conn:  # back to the pool, still holding other_lock
            await conn.execute(sa.text("SELECT GET_LOCK(:n, 0)"), {"n": other_lock})
        async with foreign.connect() as theirs:
            await theirs.execute(sa.text("SELECT GET_LOCK(:n, 0)"), {"n": name})
            blocked = asyncio.ensure_future(
                theirs.execute(sa.text("SELECT GET_LOCK(:n, 20)"), {"n": other_lock})
            )
            await eventually(waiting(engine, other_lock))
            start = time.monotonic()
            with pytest.raises(LockNotAcquired) as caught:
                await backend.acquire(resource, ttl=5, timeout=10)
            assert time.monotonic() - start < 5  # refused, not timed out
            assert "1213" in repr(caught.value.__cause__) or "3058" in repr(caught.value.__cause__)
            # Its session was ended, so the lock user code left on it went too.
            assert (await blocked).scalar() == 1
            await theirs.execute(sa.text("SELECT RELEASE_ALL_LOCKS()"))
        assert sessions_out(shared) == 0
    finally:
        await backend.aclose()
        await shared.dispose()
        await foreign.dispose()


async def test_hold_renews_past_the_ttl(backend: MySQLLockBackend, resource: str) -> None:
    lock = Lock(backend, resource, ttl=1, timeout=1)
    async with lock.hold() as lease:
        await asyncio.sleep(2.0)  # well past the TTL: only renewals keep the lock
        with pytest.raises(LockNotAcquired):
            await backend.acquire(resource, ttl=1, timeout=0)
    after = await backend.acquire(resource, ttl=1, timeout=0)
    assert after.fence > lease.fence
    await backend.release(after)


async def test_hold_reports_a_killed_session(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    finished = False

    async def killed_while_held() -> None:
        nonlocal finished
        async with Lock(backend, resource, ttl=1).hold():
            session = await holder(engine, name_of(backend, resource))
            async with engine.connect() as conn:
                await conn.execute(sa.text(f"KILL {session}"))
            await asyncio.sleep(5)  # the next renewal fails and cancels this
            finished = True

    with pytest.raises(LockLost):
        await killed_while_held()
    assert not finished
    assert sessions_out(engine) == 0


async def test_a_pooled_session_closed_meanwhile_is_replaced(
    mysql_url: str, engine: AsyncEngine, resource: str
) -> None:
    own = create_async_engine(mysql_url, pool_size=1, max_overflow=0)
    try:
        backend = MySQLLockBackend(own)
        await backend.release(await backend.acquire(resource, ttl=5, timeout=0))
        async with own.connect() as conn:
            session = (await conn.execute(sa.text("SELECT CONNECTION_ID()"))).scalar_one()
        async with engine.connect() as conn:
            await conn.execute(sa.text(f"KILL {session}"))  # as a server restart would
        lease = await backend.acquire(resource, ttl=5, timeout=0)
        await backend.release(lease)
    finally:
        await own.dispose()


async def test_unreachable_server_is_backend_unavailable(resource: str) -> None:
    eng = create_async_engine("mysql+aiomysql://root@127.0.0.1:9/none")
    try:
        backend = MySQLLockBackend(eng, timeout=2)
        with pytest.raises(BackendUnavailable) as caught:
            await backend.acquire(resource, ttl=1, timeout=0)
        assert caught.value.backend == "mysql"
    finally:
        await eng.dispose()


async def test_foreign_lease_and_aclose(engine: AsyncEngine, resource: str) -> None:
    one, other = MySQLLockBackend(engine), MySQLLockBackend(engine)
    lease = await one.acquire(resource, ttl=10, timeout=0)
    with pytest.raises(LockNotOwned):
        await other.release(lease)
    await one.aclose()
    again = await other.acquire(resource, ttl=10, timeout=5)
    await other.release(again)
    with pytest.raises(LockNotOwned):
        await one.release(lease)


def test_rejects_other_databases() -> None:
    eng = create_async_engine("sqlite+aiosqlite://")
    with pytest.raises(ValueError, match="MySQL or MariaDB"):
        MySQLLockBackend(eng)


async def test_names_are_left_alone_by_free(backend: MySQLLockBackend, engine: AsyncEngine) -> None:
    # The helper the cancellation tests rely on sees a held lock.
    lease = await backend.acquire("seen", ttl=5, timeout=0)
    assert not await free(engine, name_of(backend, "seen"))()
    await backend.release(lease)
    assert await free(engine, name_of(backend, "seen"))()


async def _engine_of_table(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        query = sa.text(
            "SELECT ENGINE FROM information_schema.TABLES"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t"
        )
        return str((await conn.execute(query, {"t": FENCE_TABLE})).scalar_one())


async def _run(engine: AsyncEngine, *statements: str) -> None:
    async with engine.begin() as conn:
        for statement in statements:
            await conn.execute(sa.text(statement))


async def test_the_fence_table_is_made_in_memory(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    await _run(engine, f"DROP TABLE IF EXISTS {FENCE_TABLE}")
    await backend.release(await backend.acquire(resource, ttl=5, timeout=0))
    assert await _engine_of_table(engine) == "MEMORY"


async def test_a_table_made_beforehand_keeps_its_engine(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    # As on Group Replication, which needs InnoDB tables.
    await _run(
        engine,
        f"DROP TABLE IF EXISTS {FENCE_TABLE}",
        f"CREATE TABLE {FENCE_TABLE} (name CHAR(64) CHARACTER SET ascii COLLATE ascii_bin"
        " NOT NULL PRIMARY KEY, fence BIGINT UNSIGNED NOT NULL) ENGINE = InnoDB",
    )
    try:
        first = await backend.acquire(resource, ttl=5, timeout=0)
        await backend.release(first)
        second = await backend.acquire(resource, ttl=5, timeout=0)
        await backend.release(second)
        assert second.fence > first.fence
        assert await _engine_of_table(engine) == "InnoDB"
    finally:
        await _run(engine, f"DROP TABLE {FENCE_TABLE}")


async def test_a_full_fence_table_is_freed_of_rows_the_clock_overtook(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    await _run(
        engine,
        f"DROP TABLE IF EXISTS {FENCE_TABLE}",
        f"CREATE TABLE {FENCE_TABLE} (name CHAR(64) CHARACTER SET ascii COLLATE ascii_bin"
        " NOT NULL PRIMARY KEY, fence BIGINT UNSIGNED NOT NULL) ENGINE = MEMORY MAX_ROWS = 10",
    )
    try:
        errors: list[object] = []
        async with engine.connect() as conn:
            for i in range(100_000):  # old fences, and one ahead of the clock
                fence = 9000000000000000000 if i == 0 else 1
                try:
                    await conn.execute(
                        sa.text(f"INSERT INTO {FENCE_TABLE} VALUES (:n, :f)"),
                        {"n": f"old-{i}", "f": fence},
                    )
                except sa.exc.OperationalError as exc:
                    errors.append(exc.orig.args[0])  # type: ignore[union-attr]
                    break
            await conn.commit()
        assert errors == [1114]  # the table is full
        lease = await backend.acquire(resource, ttl=5, timeout=0)
        assert abs(lease.fence / 1e6 - time.time()) < 60
        await backend.release(lease)
        async with engine.connect() as conn:
            left = (await conn.execute(sa.text(f"SELECT name FROM {FENCE_TABLE}"))).scalars()
            assert sorted(left) == sorted(["old-0", name_of(backend, resource)])
    finally:
        await _run(engine, f"DROP TABLE {FENCE_TABLE}")


async def test_a_waiter_does_not_hold_up_other_locks(
    backend: MySQLLockBackend, engine: AsyncEngine, resource: str
) -> None:
    # The fence table is written after the wait, not during it: a MEMORY table is
    # locked whole by a write, which would stop every other grant behind a waiter.
    first = await backend.acquire(resource, ttl=10, timeout=0)
    waiter = asyncio.ensure_future(backend.acquire(resource, ttl=10, timeout=10))
    await eventually(waiting(engine, name_of(backend, resource)))
    started = time.monotonic()
    other = await backend.acquire(f"{resource}-other", ttl=10, timeout=5)
    assert time.monotonic() - started < 2
    await backend.release(other)
    await backend.release(first)
    await backend.release(await waiter)


async def test_a_stalled_fence_write_is_unavailable_and_frees_the_lock(
    mysql_url: str, engine: AsyncEngine, resource: str
) -> None:
    # Granted, then the fence's write waits (the table locked by another session)
    # past the timeout: the session that holds the lock is ended.
    backend = MySQLLockBackend(engine, timeout=0.5)
    await backend.release(await backend.acquire(resource, ttl=5, timeout=0))
    async with engine.connect() as locker:
        await locker.execute(sa.text(f"LOCK TABLES {FENCE_TABLE} WRITE"))
        try:
            with pytest.raises(BackendUnavailable):
                await backend.acquire(resource, ttl=5, timeout=0)
            await eventually(free(engine, name_of(backend, resource)))
        finally:
            await locker.execute(sa.text("UNLOCK TABLES"))
    await backend.release(await backend.acquire(resource, ttl=5, timeout=0))
    assert sessions_out(engine) == 0
