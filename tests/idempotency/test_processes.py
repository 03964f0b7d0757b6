"""Two uvicorn server processes share PostgreSQL and Redis: one key, one side effect."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from headway.idempotency.claim import claim_record
from headway.idempotency.record import Claim, ClaimOutcome
from headway.idempotency.table import metadata, records

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def lease() -> float:
    return 30.0


@pytest.fixture
def servers(
    postgres_url: str, redis_url: str, tmp_path: Path, lease: float
) -> Iterator[tuple[list[int], Path, list[subprocess.Popen[bytes]]]]:
    effects = tmp_path / "effects.log"
    effects.touch()
    env = {
        **os.environ,
        "HEADWAY_TEST_EFFECTS": str(effects),
        "HEADWAY_TEST_DATABASE_URL": postgres_url,
        "HEADWAY_TEST_REDIS_URL": redis_url,
        "HEADWAY_TEST_LEASE": str(lease),
    }
    ports = [free_port(), free_port()]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "tests.idempotency.served:app",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
        )
        for port in ports
    ]
    try:
        deadline = time.monotonic() + 30
        for port in ports:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)  # waiting for a process to listen: no event to wait on
        yield ports, effects, procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in procs:
            proc.wait(10)


Servers = tuple[list[int], Path, list["subprocess.Popen[bytes]"]]
HEADERS = {"idempotency-key": '"charge-once"', "authorization": "Bearer same-caller"}


async def empty_table(url: str) -> None:
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(records.delete())
    await engine.dispose()


async def stored(url: str) -> list[tuple[str, bytes | None]]:
    engine = create_async_engine(url)
    async with engine.connect() as conn:
        query = sa.select(records.c.status, records.c.response_body)
        rows = [(s, b) for s, b in (await conn.execute(query)).all()]
    await engine.dispose()
    return rows


async def entered(effects: Path, count: int) -> None:
    path = Path(f"{effects}.entered")
    while not path.exists() or len(path.read_text().splitlines()) < count:
        await asyncio.sleep(0.02)  # another process's progress: polled, bounded by the test


async def test_one_key_200_requests_two_processes(
    servers: Servers, postgres_url: str, redis_client: object
) -> None:
    ports, effects, _ = servers
    await empty_table(postgres_url)
    limits = httpx.Limits(max_connections=200)
    clients = [
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30)
        for port in ports
    ]
    headers = HEADERS
    try:
        responses = await asyncio.gather(
            *(
                clients[i % 2].post("/payments", json={"amount": 42}, headers=headers)
                for i in range(200)
            )
        )
        replay = await clients[1].post("/payments", json={"amount": 42}, headers=headers)
    finally:
        for client in clients:
            await client.aclose()
    assert len(effects.read_text().splitlines()) == 1  # the side effect happened once
    created = [r for r in responses if r.status_code == 201]
    statuses = {r.status_code for r in responses}
    assert statuses <= {201, 409}
    assert created
    assert len({r.content for r in created}) == 1  # the original and identical replays
    assert sum("idempotent-replayed" not in r.headers for r in created) == 1
    assert replay.content == created[0].content
    assert replay.headers["idempotent-replayed"] == "true"


@pytest.mark.parametrize("lease", [2.0])  # renewed every 0.67 s: a stalled host keeps it
async def test_killed_worker_retry_runs_once_after_the_lease(
    servers: Servers, postgres_url: str, redis_client: object
) -> None:
    (a, b), effects, (worker_a, _) = servers
    await empty_table(postgres_url)
    async with httpx.AsyncClient(timeout=30) as client:
        doomed = asyncio.ensure_future(
            client.post(f"http://127.0.0.1:{a}/payments", json={"amount": 1},
                        headers={**HEADERS, "x-sleep": "30"})
        )  # fmt: skip
        await asyncio.wait_for(entered(effects, 1), 20)
        worker_a.kill()
        killed = time.monotonic()
        worker_a.wait(10)
        with pytest.raises(httpx.HTTPError):
            await doomed
        url = f"http://127.0.0.1:{b}/payments"
        refused = []
        while True:  # the dead worker's lease runs out on the database's clock: poll it
            sent = time.monotonic()
            retry = await client.post(url, json={"amount": 1}, headers=HEADERS)
            if retry.status_code != 409 or sent - killed > 10:
                break
            refused.append(retry)
            await asyncio.sleep(0.1)
        usable_after = sent - killed
        replay = await client.post(url, json={"amount": 1}, headers=HEADERS)
    assert refused  # the key did not run again while the lease lived
    # Retry-After: when the dead worker's lease ends at the latest, never more than the lease.
    assert all(1 <= int(r.headers["retry-after"]) <= 2 for r in refused)
    assert usable_after <= 2.0 + 1.0  # lease TTL + ~1 s
    assert retry.status_code == 201
    assert "idempotent-replayed" not in retry.headers
    assert replay.content == retry.content
    assert len(effects.read_text().splitlines()) == 1
    assert await stored(postgres_url) == [("COMPLETED", retry.content)]


async def completion_waiting(engine: AsyncEngine) -> None:
    """Until a completion (the UPDATE that stores a response) waits for a row lock."""
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE '%response_body%'"
    )
    while True:
        async with engine.connect() as conn:
            if (await conn.execute(query)).scalar_one():
                return
        await asyncio.sleep(0.02)  # another process's progress: polled, bounded by the test


async def take_over(holder: AsyncConnection, scope: str, key: str, fingerprint: str) -> Claim:
    """A newer claim of the record, in ``holder``'s transaction, once its lease is over."""
    while True:
        newer = await claim_record(
            holder, scope, key, fingerprint,
            fence=None, lease_token="newer", lease_ttl=30, ttl=60,
        )  # fmt: skip
        if newer.outcome is ClaimOutcome.CLAIMED:
            return newer
        await asyncio.sleep(0.1)  # the paused worker's lease ends on the database clock: polled


async def all_rows(engine: AsyncEngine) -> list[tuple[object, ...]]:
    """Every record's status, fence and stored body."""
    async with engine.connect() as conn:
        query = sa.select(records.c.status, records.c.fence, records.c.response_body)
        return [tuple(row) for row in (await conn.execute(query)).all()]


@pytest.mark.parametrize("lease", [2.0])  # renewed every 0.67 s: a stalled host keeps it
async def test_paused_workers_late_completion_is_rejected_by_the_fence(
    servers: Servers, postgres_url: str, redis_client: object, tmp_path: Path
) -> None:
    """Worker A's completion arrives while a newer holder still has the record PROCESSING:
    same key, same status, same fingerprint: only the fencing token can refuse it."""
    (a, _), effects, (worker_a, _) = servers
    await empty_table(postgres_url)
    gate = tmp_path / "gate-a"
    engine = create_async_engine(postgres_url)
    stopped = False
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            late_request = asyncio.ensure_future(
                client.post(f"http://127.0.0.1:{a}/payments", json={"amount": 1},
                            headers={**HEADERS, "x-gate": str(gate)})
            )  # fmt: skip
            await asyncio.wait_for(entered(effects, 1), 20)  # A claimed the record and runs
            async with engine.begin() as holder:  # holds A's row until it commits
                lock_row = sa.select(records.c.scope, records.c.fingerprint, records.c.fence)
                first = (await holder.execute(lock_row.with_for_update())).one()
                gate.touch()  # A's handler returns; its completion queues behind our lock
                await asyncio.wait_for(completion_waiting(engine), 20)
                os.kill(worker_a.pid, signal.SIGSTOP)  # ...and A stalls, its write in flight
                stopped = True
                # A newer holder takes the record over once A's lease is over.
                newer = await take_over(holder, first.scope, "charge-once", first.fingerprint)
            # Committed: A's queued completion now meets the newer holder's record.
            os.kill(worker_a.pid, signal.SIGCONT)
            stopped = False
            try:
                late = (await late_request).status_code
            except httpx.HTTPError:
                late = None  # the response was cut: its completion was refused
        rows = await all_rows(engine)
    finally:
        if stopped:
            os.kill(worker_a.pid, signal.SIGCONT)
        await engine.dispose()
    assert newer.fence is not None
    assert newer.fence > first.fence
    assert late != 201  # never a finished response whose record was not stored
    # The newer holder's record is untouched: still PROCESSING, under its fence, no response.
    assert rows == [("PROCESSING", newer.fence, None)]
