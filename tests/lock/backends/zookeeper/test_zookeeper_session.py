"""Session loss and outages, on throw-away ZooKeeper servers with 100 ms ticks (so a
session can be a second long): a holder frozen past its session loses the lock to the
next holder, whose fence is higher, and learns it as ``LockLost``; a stopped server
means ``BackendUnavailable`` within the timeout, and locking resumes once it is back."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from headway import BackendUnavailable, ZooKeeperLockBackend
from tests.conftest import need
from tests.zookeeper_server import ZooKeeperServer, available

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[4]
SESSION = 1.0  # the holder's session timeout (s), a lease's upper bound
FROZEN = 3.0  # the holder's pause: well past its session


async def test_session_expiry_while_holding_gives_lock_lost_and_a_higher_fence(
    fast_zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    hosts, prefix = fast_zookeeper.hosts, f"/headway-test/{uuid.uuid4().hex}"
    with (tmp_path / "holder.err").open("wb") as err:
        holder = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "tests.lock.backends.zookeeper.holder"),
            *(hosts, prefix, "r", str(SESSION), "0.9"),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
    assert holder.stdout is not None
    backend = ZooKeeperLockBackend(hosts, session_timeout=SESSION, prefix=prefix)
    try:
        async with asyncio.timeout(30):
            line = (await holder.stdout.readline()).decode().split()
        assert line[0] == "held", (line, (tmp_path / "holder.err").read_text())
        held = int(line[1])
        # Frozen, the holder can neither renew nor give the lock up by itself: only the
        # server ending its session frees the lock.
        os.kill(holder.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            lease = await backend.acquire("r", SESSION, FROZEN - 0.5)
            assert time.monotonic() - frozen >= SESSION * 0.9  # not before the session ended
        finally:
            os.kill(holder.pid, signal.SIGCONT)
        assert lease.fence > held
        async with asyncio.timeout(15):
            report = (await holder.stdout.readline()).decode()
        assert report.startswith(f"lost {held} "), report
        await backend.release(lease)
        assert await holder.wait() == 0
    finally:
        if holder.returncode is None:
            os.kill(holder.pid, signal.SIGKILL)
            await holder.wait()
        await backend.aclose()


async def test_a_stopped_server_is_unavailable_within_the_timeout_then_resumes(
    tmp_path: Path,
) -> None:
    if (why := available()) is not None:
        need("a throw-away ZooKeeper", why)
    server = ZooKeeperServer(tmp_path)
    server.start()
    backend = ZooKeeperLockBackend(server.hosts, session_timeout=5, timeout=0.5)
    try:
        before = await backend.acquire("r", 2, 1)
        await backend.release(before)
        server.stop()
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await backend.acquire("r", 2, 1)
        assert time.monotonic() - started < 0.5 + 1.0  # the timeout, and a margin
        server.start()
        async with asyncio.timeout(20):
            while True:
                try:
                    after = await backend.acquire("r", 2, 1)
                    break
                except BackendUnavailable:
                    await asyncio.sleep(0.2)  # kazoo reconnects in its own time
        assert after.fence > before.fence
        await backend.release(after)
    finally:
        await backend.aclose()
        server.stop()
