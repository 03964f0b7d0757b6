"""One process of ``test_settle_processes``: tasks reserving and settling on one key per algorithm.

Forked from the test (``work``): redis-py is imported already, which a new interpreter
takes seconds to do on a loaded machine. Once connected it waits at a barrier, so that
every process starts together. For each limiter in turn (its own key), ``tasks`` tasks
reserve a random estimate, hold it a moment, and settle a random actual cost (a refund,
the estimate, or more: debt), for ``seconds``. Every step is recorded with the server
time the script returned (``Reservation.at_us``, ``settled_at_us``): one report per
limiter (a spec: its policies, metered unless said otherwise).
"""

from __future__ import annotations

import asyncio
import random
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from typing import Any

from headway import RateLimiter, RedisRateLimitBackend
from headway.ratelimit.algorithms import ALGORITHMS
from headway.ratelimit.policies import Policy


async def _run(
    limiter: RateLimiter, key: str, seconds: float, tasks: int, rng: random.Random
) -> dict[str, list[list[int]]]:
    reserved: list[list[int]] = []  # [at_us, estimate, allowed, remaining]
    settled: list[list[int]] = []  # [settled_at_us, at_us, estimate, actual]
    deadline = time.monotonic() + seconds

    async def task() -> None:
        while time.monotonic() < deadline:
            estimate = rng.randint(0, 6)
            reservation = await limiter.reserve(key, estimate)
            assert reservation.at_us is not None, "a failure mode answered"
            decision = reservation.decision
            reserved.append(
                [reservation.at_us, estimate, int(decision.allowed), decision.remaining]
            )
            if not reservation:
                await asyncio.sleep(rng.uniform(0, 0.004))
                continue
            await asyncio.sleep(rng.uniform(0, 0.003))  # the response streams
            actual = rng.choice([0, estimate // 2, estimate, estimate + 3, 2 * estimate + 1])
            if await limiter.settle(reservation, actual) and actual != estimate:
                assert reservation.settled_at_us is not None
                settled.append([reservation.settled_at_us, reservation.at_us, estimate, actual])

    await asyncio.gather(*(task() for _ in range(tasks)))
    return {"reserved": reserved, "settled": settled}


def policies_of(spec: list[dict[str, Any]]) -> tuple[list[Policy], list[Policy]]:
    """A spec's policies (``{"name", "args"}`` each, ``"metered": false`` for a request
    policy), and the metered ones."""
    policies, metered = [], []
    for described in spec:
        policy_class = next(a.policy for a in ALGORITHMS if a.policy.name == described["name"])
        policies.append(policy_class(*described["args"]))
        if described.get("metered", True):
            metered.append(policies[-1])
    return policies, metered


async def _main(
    url: str, key: str, specs: list[list[dict[str, Any]]], seconds: float, tasks: int, seed: str,
    ready: Barrier,
) -> list[dict[str, list[list[int]]]]:  # fmt: skip
    rng = random.Random(seed)
    backend = RedisRateLimitBackend.from_url(url, timeout=10.0)
    limiters = []
    for spec in specs:
        policies, metered = policies_of(spec)
        # A loaded machine: no failure-mode decisions.
        limiters.append(RateLimiter(*policies, backend=backend, budget=10.0, metered=metered))
    for limiter in limiters:  # connected, scripts loaded
        await limiter.settle(await limiter.reserve(f"{key}-warm", 1), 2)
    ready.wait()  # every process starts together (a moment's block: nothing else runs)
    reports = []
    for i, limiter in enumerate(limiters):
        reports.append(await _run(limiter, f"{key}-{i}", seconds, tasks, rng))
    await backend.aclose()
    return reports


def work(
    out: Connection, url: str, key: str, specs: list[list[dict[str, Any]]], seconds: float,
    tasks: int, seed: str, ready: Barrier,
) -> None:  # fmt: skip
    """A forked process's body: run, and send the reports (one per policy) on ``out``."""
    out.send(asyncio.run(_main(url, key, specs, seconds, tasks, seed, ready)))
    out.close()
