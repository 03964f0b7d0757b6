"""PostgreSQL's ``inspect``: the owner rides in the session's ``application_name`` for the
lease's transaction only; a pooled session goes back with its own name."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from headway import Lock, LockState
from headway.lock.backends.postgres import PostgresLockBackend
from headway.lock.backends.postgres_inspect import label_owner
from headway.lock.shared import Semaphore

pytestmark = pytest.mark.anyio


async def test_the_label_lasts_as_long_as_the_lease(postgres_url: str, resource: str) -> None:
    # One pooled session: the lease's, then the one the test reads its name on.
    engine = create_async_engine(
        postgres_url,
        pool_size=1,
        max_overflow=0,
        connect_args={"server_settings": {"application_name": "billing"}},
    )
    backend = PostgresLockBackend(engine)
    try:
        for lock in (
            Lock(backend, resource, ttl=10, owner="web-7"),
            Semaphore(backend, resource, permits=1, ttl=10, owner="web-7"),
        ):
            lease = await lock.acquire()
            [holder] = (await _inspect_elsewhere(postgres_url, lock)).holders
            assert (holder.owner, holder.expires_in) == ("web-7", None)
            await lock.release(lease)
            async with engine.connect() as conn:
                name = (await conn.execute(text("SHOW application_name"))).scalar_one()
            assert name == "billing"
    finally:
        await backend.aclose()
        await engine.dispose()


async def _inspect_elsewhere(url: str, lock: Lock) -> LockState:
    # The engine's one session is the lease's: ask over another engine, as an operator would.
    engine = create_async_engine(url)
    try:
        other = Lock(PostgresLockBackend(engine), lock.resource)
        if isinstance(lock, Semaphore):
            other = Semaphore(PostgresLockBackend(engine), lock.resource, permits=lock.permits)
        return await other.inspect()
    finally:
        await engine.dispose()


def test_only_our_labels_name_owners() -> None:
    assert label_owner("headway:web-7") == "web-7"
    for foreign in (None, "", "billing", "headway:", "headway:two words", "psql"):
        assert label_owner(foreign) is None, foreign
