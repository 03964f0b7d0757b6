"""A fleet-wide nightly job: every instance schedules it, one instance runs it per night.

Three instances of an app (here three tasks, their clocks a little apart) each run the
same scheduler loop; ``run_once`` lets the first caller of each night run the report
and the others skip. Nights are shortened to a second so the example ends quickly.

Run: ``python3 -m uv run python examples/nightly_job.py`` (uses HEADWAY_REDIS_URL if
set, else the in-memory backend).
"""

from __future__ import annotations

import asyncio
import os
import time

from redis.asyncio import Redis

import headway

NIGHT = 1.0  # seconds stand in for a day: the real job would use 24 * 3600
NIGHTS = 3


def make_backend() -> headway.LockBackend:
    url = os.environ.get("HEADWAY_REDIS_URL")
    if url:
        return headway.RedisLockBackend(Redis.from_url(url))
    return headway.MemoryLockBackend()


backend = make_backend()
reports: list[str] = []


# at_most_for: a dead runner blocks the job this long at most (well above a run).
# at_least_for: no second run sooner, whatever the instances' clock skew (above it,
# below the period). The real job: at_most_for=3600, at_least_for=600.
@headway.run_once(backend, "nightly-report", at_most_for=0.9 * NIGHT, at_least_for=0.5 * NIGHT)
async def nightly_report(night: int, instance: str) -> str:
    await asyncio.sleep(0.05)  # build and send the report
    reports.append(f"night {night} by {instance}")
    return f"report {night} sent"


async def instance(name: str, clock_skew: float, start: float) -> None:
    """One app instance's scheduler: call the job at each night's moment, by its clock."""
    for night in range(NIGHTS):
        due = start + night * NIGHT + clock_skew
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        result = await nightly_report(night, name)
        if isinstance(result, headway.Skipped):
            print(f"{name}: night {night} skipped, another instance has it")
        else:
            print(f"{name}: {result}")


async def main() -> None:
    start = time.monotonic() + 0.1
    skews = {"web-1": 0.0, "web-2": 0.1, "web-3": 0.2}  # up to 200 ms apart
    await asyncio.gather(*(instance(name, skew, start) for name, skew in skews.items()))
    print(f"{len(reports)} reports in {NIGHTS} nights: {reports}")


if __name__ == "__main__":
    asyncio.run(main())
