"""Two uvicorn server processes share PostgreSQL and Redis: one key, one side effect."""

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from headway.idempotency import metadata, records

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def servers(postgres_url: str, redis_url: str, tmp_path: Path) -> Iterator[tuple[list[int], Path]]:
    effects = tmp_path / "effects.log"
    effects.touch()
    env = {
        **os.environ,
        "HEADWAY_TEST_EFFECTS": str(effects),
        "HEADWAY_TEST_DATABASE_URL": postgres_url,
        "HEADWAY_TEST_REDIS_URL": redis_url,
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
        yield ports, effects
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


async def test_one_key_200_requests_two_processes(
    servers: tuple[list[int], Path], postgres_url: str, redis_client: object
) -> None:
    ports, effects = servers
    engine = create_async_engine(postgres_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(records.delete())
    await engine.dispose()
    limits = httpx.Limits(max_connections=200)
    clients = [
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30)
        for port in ports
    ]
    headers = {"idempotency-key": '"charge-once"', "authorization": "Bearer same-caller"}
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
