"""Leased quota under real concurrency: 4 OS processes x 8 tasks (or threads) on one key, counted.

Demand is four times the rate, spread over time. Every admission is recorded as the
realtime interval (the clock Redis's TIME reads on this machine) around its ``hit``, which holds the
moment it was really admitted: in process, or in the script. Counting only the
admissions that certainly fall in a window (interval inside it), no window of the
algorithm ever holds more than it allows; an admission the checks cannot place
(an interval across a boundary) is left out, never counted twice.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
PROCESSES, TASKS, SECONDS = 4, 8, 1.2
Interval = tuple[int, int]


async def _run(
    redis_url: str, modes: Sequence[str], spec: dict[str, object]
) -> list[dict[str, object]]:
    """Start one worker per mode, start them together, and read their reports."""
    key = f"leased-{uuid.uuid4().hex}"
    args = (redis_url, key, json.dumps(spec), str(SECONDS), str(TASKS), "16", "0.25")
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "tests.ratelimit.lease_worker", mode, *args),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for mode in modes
    ]
    try:
        async with asyncio.timeout(60):
            for w in workers:
                assert w.stdout is not None
                assert (await w.stdout.readline()).strip() == b"ready", await w.stderr.read()  # type: ignore[union-attr]
            for w in workers:  # together
                assert w.stdin is not None
                w.stdin.write(b"go\n")
                await w.stdin.drain()
            reports = await _reports(workers, modes)
    finally:
        for w in workers:
            if w.returncode is None:
                w.kill()
                await w.wait()
    return reports


async def _reports(
    workers: list[asyncio.subprocess.Process], modes: Sequence[str]
) -> list[dict[str, object]]:
    solo = [w for w, m in zip(workers, modes, strict=True) if m == "solo"]
    for w in solo:
        assert w.stdout is not None
        assert (await w.stdout.readline()).strip() == b"one"
    others = [w for w in workers if w not in solo]
    outputs = {id(w): await w.communicate() for w in others}  # idle ones: leases given back
    for w in solo:  # then the solo one alone
        outputs[id(w)] = await w.communicate(b"go\n")
    reports = []
    for w in workers:
        out, err = outputs[id(w)]
        assert w.returncode == 0, err.decode()[-3000:]
        reports.append(json.loads(out.splitlines()[-1]))
    return reports


def _intervals(reports: list[dict[str, object]]) -> list[Interval]:
    return sorted((a, b) for r in reports for a, b in r["admitted"])  # type: ignore[attr-defined]


def _per_window(admitted: list[Interval], window_us: int) -> Counter[int]:
    return Counter(a // window_us for a, b in admitted if a // window_us == b // window_us)


def check_fixed_window(admitted: list[Interval], limit: int, window_us: int) -> None:
    counts = _per_window(admitted, window_us)
    assert max(counts.values()) <= limit, counts
    assert max(counts.values()) >= limit // 2, counts  # the demand really was above it


def check_sliding_counter(admitted: list[Interval], limit: int, window_us: int) -> None:
    check_fixed_window(admitted, limit, window_us)  # never more than limit in a window
    counts = _per_window(admitted, window_us)
    inside: dict[int, list[Interval]] = {}
    for a, b in admitted:
        if a // window_us == b // window_us:
            inside.setdefault(a // window_us, []).append((a, b))
    for index, group in inside.items():  # and the weighted estimate at each admission
        for a, b in group:
            before = sum(1 for _, end in group if end < a)  # certainly admitted earlier
            elapsed = b - index * window_us  # the latest it can have been: the lightest weight
            weighted = counts[index - 1] * (window_us - elapsed) + (before + 1) * window_us
            assert weighted <= limit * window_us, (index, counts[index - 1], before, b - a)


def check_bucket(admitted: list[Interval], capacity: int, interval_us: int) -> None:
    """In any [s, t], at most capacity + (t - s) / interval units."""
    for s, _ in admitted:
        ends = sorted(b for a, b in admitted if a >= s)
        for count, t in enumerate(ends, 1):
            assert count <= capacity + (t - s) // interval_us, (s, t, count)


# Each task pauses ``pace`` seconds between hits: all of them together ask for 4 times the
# rate (windows: 200 per 0.4 s; buckets: 200 per second after a burst of 40).
CASES = {
    "fixed_window": ({"name": "fixed_window", "args": [200, 0.4], "pace": 0.016}, 400_000),
    "sliding_counter": ({"name": "sliding_counter", "args": [200, 0.4], "pace": 0.016}, 400_000),
    "token_bucket": ({"name": "token_bucket", "args": [40, 200, 1.0], "pace": 0.04}, 5_000),
    "leaky_bucket": ({"name": "leaky_bucket", "args": [40, 200, 1.0], "pace": 0.04}, 5_000),
}


def _check(algorithm: str, admitted: list[Interval], limit: int, param_us: int) -> None:
    if algorithm == "fixed_window":
        check_fixed_window(admitted, limit, param_us)
    elif algorithm == "sliding_counter":
        check_sliding_counter(admitted, limit, param_us)
    else:
        check_bucket(admitted, limit, param_us)
        assert len(admitted) >= limit  # the demand really was above the rate


@pytest.mark.parametrize(
    ("mode", "algorithm"),
    [("hammer", name) for name in sorted(CASES)]
    # SyncRateLimiter: 4 processes x 8 threads, each process's threads sharing one limiter.
    + [("sync", "fixed_window"), ("sync", "token_bucket")],
)
async def test_processes_never_admit_more_than_the_algorithm_allows(
    redis_url: str, mode: str, algorithm: str
) -> None:
    spec, param_us = CASES[algorithm]
    admitted = _intervals(await _run(redis_url, [mode] * PROCESSES, spec))
    _check(algorithm, admitted, spec["args"][0], param_us)  # type: ignore[index]


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_counter"])
async def test_one_busy_process_gets_the_units_idle_ones_leased(
    redis_url: str, algorithm: str
) -> None:
    spec = {"name": algorithm, "args": [100, 3600.0], "pace": 0}
    reports = await _run(redis_url, ["solo"] + ["idle"] * (PROCESSES - 1), spec)
    assert [r["held"] for r in reports] == [0] * PROCESSES  # the idle ones gave theirs back
    assert sum(r["admitted"] for r in reports) == 100  # type: ignore[misc]
