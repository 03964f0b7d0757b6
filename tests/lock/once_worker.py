"""The instances of the fleet test (``test_once_fleet.py``), each its own OS process.

``main`` imports everything once, then forks the instances (as ``safety_worker``
does). Each one connects to the parent's Unix socket, says ``ready INDEX PID``, and
is answered ``start BASE`` (a ``time.time()``). It then plays a scheduler whose clock
is ``OFFSET`` s ahead of the others' (``INDEX * at_least_for / 2 / (INSTANCES - 1)``):
it calls the ``run_once`` job for window ``w`` at ``BASE + w * PERIOD + OFFSET``. The
job logs ``(window, instance)`` in PostgreSQL; in window ``KILL_WINDOW`` it also tells
the parent ``kill-me`` and sleeps, and the parent SIGKILLs it there, mid-run. At the
end each survivor sends ``done`` and the windows it ran.

Usage: python -m tests.lock.once_worker BACKEND INSTANCES TABLE RESOURCE NAMESPACE
PERIOD AT_MOST_FOR AT_LEAST_FOR WINDOWS KILL_WINDOW SOCKET, with
HEADWAY_TEST_REDIS_URL / HEADWAY_TEST_DATABASE_URL (and for etcd HEADWAY_TEST_ETCD_URL,
for mysql HEADWAY_TEST_MYSQL_URL) in the environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass

import sqlalchemy as sa
from redis import asyncio as aioredis
from sqlalchemy.ext.asyncio import create_async_engine

from headway import Skipped, run_once
from tests.lock.safety_worker import Parent, make_backend


@dataclass(frozen=True)
class Plan:
    """The fleet's schedule: shared by the parent and every instance."""

    instances: int
    period: float
    at_most_for: float
    at_least_for: float
    windows: int
    kill_window: int

    def offset(self, instance: int) -> float:
        """How far ``instance``'s clock is ahead: evenly up to half of at_least_for."""
        return instance * self.at_least_for / 2 / (self.instances - 1)

    def args(self) -> list[str]:
        return [
            str(self.instances), str(self.period), str(self.at_most_for),
            str(self.at_least_for), str(self.windows), str(self.kill_window),
        ]  # fmt: skip


def runs_table(name: str) -> tuple[sa.MetaData, sa.Table]:
    """The log of every run: its window and the instance that ran it."""
    metadata = sa.MetaData()
    table = sa.Table(
        name,
        metadata,
        sa.Column("seq", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("window", sa.Integer, nullable=False),
        sa.Column("instance", sa.Integer, nullable=False),
    )
    return metadata, table


async def run(
    backend_name: str, instance: int, table: str, resource: str, namespace: str, plan: Plan,
    parent: Parent,
) -> None:  # fmt: skip
    _, runs = runs_table(table)
    engine = create_async_engine(os.environ["HEADWAY_TEST_DATABASE_URL"], pool_size=3)
    client = aioredis.Redis.from_url(os.environ["HEADWAY_TEST_REDIS_URL"])
    backend, close = make_backend(backend_name, engine, client, namespace)
    ran: list[int] = []
    late = 0.0

    @run_once(backend, resource, at_most_for=plan.at_most_for, at_least_for=plan.at_least_for)
    async def job(window: int) -> None:
        async with engine.begin() as conn:
            await conn.execute(sa.insert(runs).values(window=window, instance=instance))
        ran.append(window)
        # The first run of the kill window is SIGKILLed here, mid-run.
        if window == plan.kill_window and parent.ask("kill-me") == "die":
            await asyncio.sleep(60)

    try:
        async with engine.connect() as conn:  # warm the pool and the scripts up
            await conn.execute(sa.text("SELECT 1"))
        await backend.release(await backend.acquire(f"{resource}-warmup-{instance}", 5, 5))
        kind, base = parent.ask(f"ready {instance} {os.getpid()}").split()
        assert kind == "start"
        for window in range(plan.windows):
            due = float(base) + window * plan.period + plan.offset(instance)
            late = max(late, time.time() - due)
            await asyncio.sleep(max(0.0, due - time.time()))
            outcome = await job(window)
            assert outcome is None or isinstance(outcome, Skipped)
        # A scheduler lives on: closing the backend within at_least_for of a run may end
        # a lease that still keeps the window (etcd revokes its leases on close).
        end = float(base) + plan.windows * plan.period + plan.at_least_for
        await asyncio.sleep(max(0.0, end - time.time()))
    finally:
        await close()
        await client.aclose()
        await engine.dispose()
    parent.tell("done " + json.dumps({"ran": ran, "late": late}))


def work(args: list[str], instance: int, path: str) -> int:
    backend_name, table, resource, namespace = args[0], args[2], args[3], args[4]
    period, most, least, windows, kill = args[5:10]
    plan = Plan(int(args[1]), float(period), float(most), float(least), int(windows), int(kill))
    try:
        asyncio.run(run(backend_name, instance, table, resource, namespace, plan, Parent(path)))
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    args, path = sys.argv[1:11], sys.argv[11]
    create_async_engine(os.environ["HEADWAY_TEST_DATABASE_URL"])  # load the dialects once
    if args[0] == "mysql":
        create_async_engine(os.environ["HEADWAY_TEST_MYSQL_URL"])
    pids = []
    for instance in range(int(args[1])):
        pid = os.fork()  # before any loop or thread exists
        if pid == 0:
            code = work(args, instance, path)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    # One instance is SIGKILLed on purpose; any other failure fails the run.
    killed = codes.count(-signal.SIGKILL)
    sys.exit(0 if killed == 1 and codes.count(0) == len(codes) - 1 else 1)


if __name__ == "__main__":
    main()
