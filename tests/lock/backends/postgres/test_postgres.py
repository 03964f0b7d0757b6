"""PostgresLockBackend against a real PostgreSQL server (asyncpg): grants, TTLs, fences."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from headway import BackendUnavailable, Lock, LockLost, LockNotAcquired, LockNotOwned
from headway.lock.backends.postgres import PostgresLockBackend, advisory_key
from tests.lock.backends.postgres.sessions import eventually, lock_rows, sessions_out, waiting

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


async def test_acquire_release(
    backend: PostgresLockBackend, engine: AsyncEngine, resource: str
) -> None:
    before = time.monotonic()
    lease = await backend.acquire(resource, ttl=5, timeout=0)
    assert (lease.resource, lease.ttl) == (resource, 5.0)
    assert before + 5 <= lease.deadline <= time.monotonic() + 5
    with pytest.raises(LockNotAcquired) as caught:
        await backend.acquire(resource, ttl=5, timeout=0)
    assert caught.value.resource == resource
    await backend.release(lease)
    again = await backend.acquire(resource, ttl=5, timeout=0)
    assert again.fence > lease.fence
    with pytest.raises(LockNotOwned):
        await backend.release(lease)
    with pytest.raises(LockNotOwned):
        await backend.extend(lease, 5)
    await backend.release(again)
    assert sessions_out(engine) == 0


async def test_exclusion_counted(backend: PostgresLockBackend, engine: AsyncEngine) -> None:
    resource, tasks, rounds = f"count-{uuid.uuid4().hex}", 10, 4
    inside, most, counter = 0, 0, 0
    fences: list[int] = []

    async def worker() -> None:
        nonlocal inside, most, counter
        for _ in range(rounds):
            lease = await backend.acquire(resource, ttl=10, timeout=30)
            inside += 1
            most = max(most, inside)
            fences.append(lease.fence)
            seen = counter
            await asyncio.sleep(0)  # let every other task run while we hold the lock
            counter = seen + 1
            inside -= 1
            await backend.release(lease)

    await asyncio.gather(*(worker() for _ in range(tasks)))
    assert (counter, most) == (tasks * rounds, 1)
    assert fences == sorted(fences)
    assert len(set(fences)) == len(fences)
    assert await lock_rows(engine, resource) == []


async def test_timeout_raises_and_leaves_nothing(
    backend: PostgresLockBackend, engine: AsyncEngine, resource: str
) -> None:
    lease = await backend.acquire(resource, ttl=5, timeout=0)
    with pytest.raises(LockNotAcquired, match=r"within 0\.2 s"):
        await backend.acquire(resource, ttl=5, timeout=0.2)
    assert await lock_rows(engine, resource) == [True]
    assert sessions_out(engine) == 1  # the holder's session; the waiter's went back
    await backend.release(lease)


@pytest.mark.parametrize("first_call", ["extend", "release"])
async def test_idle_holder_loses_the_lock(
    backend: PostgresLockBackend, resource: str, first_call: str
) -> None:
    stale = await backend.acquire(resource, ttl=0.3, timeout=0)
    # The server kills the idle holder's session after its TTL; the waiter gets in.
    fresh = await backend.acquire(resource, ttl=1, timeout=10)
    # It waited about 0.3 s, more than a tenth of its TTL: its deadline restarts after the grant.
    assert fresh.remaining() > 0.8
    assert fresh.fence > stale.fence
    first = backend.extend(stale, 1) if first_call == "extend" else backend.release(stale)
    with pytest.raises(LockNotOwned, match="no longer held"):
        await first
    for call in (backend.extend(stale, 1), backend.release(stale)):
        with pytest.raises(LockNotOwned):
            await call
    await backend.extend(fresh, 1)
    await backend.release(fresh)


async def test_extend_restarts_and_resets_the_ttl(
    backend: PostgresLockBackend, resource: str
) -> None:
    lease = await backend.acquire(resource, ttl=2.0, timeout=0)
    for _ in range(3):  # 2.4 s in all, longer than the TTL, but never idle that long
        await asyncio.sleep(0.8)  # (1.2 s of margin: a host stealing CPU stalls for 0.6 s)
        lease = await backend.extend(lease, 2.0)
    with pytest.raises(LockNotAcquired):
        await backend.acquire(resource, ttl=1, timeout=0)
    lease = await backend.extend(lease, 5)
    assert lease.ttl == 5.0
    await asyncio.sleep(2.5)  # idle longer than the old TTL, shorter than the new one
    lease = await backend.extend(lease, 3)
    await backend.release(lease)


async def test_fence_is_taken_after_the_grant(
    backend: PostgresLockBackend, engine: AsyncEngine, resource: str
) -> None:
    first = await backend.acquire(resource, ttl=10, timeout=0)
    waiter = asyncio.ensure_future(backend.acquire(resource, ttl=10, timeout=10))
    await eventually(waiting(engine, resource))
    # A transaction id assigned while the waiter waits: the waiter's fence must be later.
    async with engine.begin() as conn:
        meanwhile = (await conn.execute(sa.text("SELECT txid_current()"))).scalar_one()
    await backend.release(first)
    second = await waiter
    assert first.fence < meanwhile < second.fence
    await backend.release(second)


async def test_hold_renews_past_the_ttl(backend: PostgresLockBackend, resource: str) -> None:
    lock = Lock(backend, resource, ttl=0.4, timeout=1)
    async with lock.hold() as lease:
        await asyncio.sleep(1.0)  # well past the TTL: only renewals keep the lock
        with pytest.raises(LockNotAcquired):
            await backend.acquire(resource, ttl=1, timeout=0)
    after = await backend.acquire(resource, ttl=1, timeout=0)
    assert after.fence > lease.fence
    await backend.release(after)


async def test_hold_reports_a_killed_session(
    backend: PostgresLockBackend, engine: AsyncEngine, resource: str
) -> None:
    key = advisory_key(resource)
    finished = False

    async def killed_while_held() -> None:
        nonlocal finished
        async with Lock(backend, resource, ttl=0.6).hold():
            async with engine.connect() as conn:
                await conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = "
                        "'advisory' AND classid::bigint = :hi AND objid::bigint = :lo"
                    ),
                    {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF},
                )
            await asyncio.sleep(5)  # the next renewal fails and cancels this
            finished = True

    with pytest.raises(LockLost):
        await killed_while_held()
    assert not finished
    assert sessions_out(engine) == 0


async def test_unreachable_server_is_backend_unavailable(resource: str) -> None:
    eng = create_async_engine("postgresql+asyncpg://postgres@127.0.0.1:9/none")
    try:
        backend = PostgresLockBackend(eng, timeout=2)
        with pytest.raises(BackendUnavailable) as caught:
            await backend.acquire(resource, ttl=1, timeout=0)
        assert caught.value.backend == "postgres"
    finally:
        await eng.dispose()


async def test_foreign_lease_and_aclose(engine: AsyncEngine, resource: str) -> None:
    one, other = PostgresLockBackend(engine), PostgresLockBackend(engine)
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
    with pytest.raises(ValueError, match="PostgreSQL"):
        PostgresLockBackend(eng)


def test_advisory_key() -> None:
    keys = {advisory_key(f"r{i}") for i in range(1000)}
    assert len(keys) == 1000
    assert all(-(2**63) <= k < 2**63 for k in keys)
    assert advisory_key("r1") == advisory_key("r1")
    assert any(k < 0 for k in keys)
