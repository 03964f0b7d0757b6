"""Reserve, then settle, under real concurrency: 4 OS processes x 8 tasks on one key, counted.

Each task reserves a random estimate, holds it a moment and settles a random actual cost
(a refund, the estimate, the rest: debt). Every step carries the server time its script
returned, so the steps on one key (which Redis runs one at a time) are put back in the
order they ran. Two checks per algorithm, on that order:

- **The limit, with the debt rule.** At every admission, what was charged so far and
  still counts (each reservation at its estimate, or at its actual cost once settled:
  refunds and extra charges alike) plus the new estimate fits the algorithm's bound: a
  window's limit, the sliding counter's weighted estimate, a bucket's capacity plus its
  refill since any earlier moment. Debt never lets one more reservation in.
- **Exactness.** The reference model (the in-memory backend), replaying every step at
  its server time, admits exactly the same reservations, with the same ``remaining``.
"""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from headway import FakeClock, SyncMemoryRateLimitBackend
from headway.ratelimit.policies import Policy
from tests.ratelimit import settle_worker
from tests.ratelimit.strategies import set_us

pytestmark = pytest.mark.redis

PROCESSES, TASKS, SECONDS = 4, 8, 0.5
SPECS: list[list[dict[str, Any]]] = [
    [{"name": "fixed_window", "args": [300, 0.3]}],
    [{"name": "sliding_log", "args": [300, 0.3]}],
    [{"name": "sliding_counter", "args": [300, 0.3]}],
    [{"name": "token_bucket", "args": [60, 600, 1.0]}],
    [{"name": "leaky_bucket", "args": [60, 600, 1.0]}],
    # Requests and tokens per minute in one call: the request policy charged 1 per
    # reservation and never settled, the token policy the estimate, then settled.
    [
        {"name": "fixed_window", "args": [60, 0.3], "metered": False},
        {"name": "token_bucket", "args": [60, 600, 1.0]},
    ],
]
# (time, order, kind, ...): a reservation (kind 0: estimate, allowed, remaining) or a
# settle (kind 1: the reservation's time, estimate, actual).
Step = tuple[int, int, int, int, int, int]


def _run(redis_url: str) -> list[list[dict[str, Any]]]:
    """Fork the workers, start them together; per worker, one report per policy of ``SPECS``."""
    key = f"settle-{uuid.uuid4().hex}"
    fork = multiprocessing.get_context("fork")
    ready = fork.Barrier(PROCESSES)
    pipes = [fork.Pipe(duplex=False) for _ in range(PROCESSES)]
    workers = [
        fork.Process(
            target=settle_worker.work,
            args=(sent, redis_url, key, SPECS, SECONDS, TASKS, f"{key}-{i}", ready),
        )
        for i, (_, sent) in enumerate(pipes)
    ]
    for w in workers:
        w.start()
    try:
        reports = []
        for received, _ in pipes:
            assert received.poll(60), "a worker sent nothing"
            reports.append(received.recv())
        for w in workers:
            w.join(10)
            assert w.exitcode == 0
    finally:
        for w in workers:
            if w.is_alive():
                w.kill()
    return reports


def _steps(reports: Sequence[dict[str, Any]]) -> list[Step]:
    steps: list[Step] = []
    for report in reports:
        steps += [(at, 0, 0, e, ok, left) for at, e, ok, left in report["reserved"]]
        steps += [(s, 0, 1, at, e, x) for s, at, e, x in report["settled"]]
    steps.sort()
    times = [s[0] for s in steps]
    # Redis runs the scripts on one key one at a time, each reading TIME: never twice the
    # same microsecond, so the order is certain.
    assert len(set(times)) == len(times), "two steps at one server microsecond"
    return steps


def check_windows(policy: Policy, steps: Sequence[Step]) -> None:
    """At each admission: what still counts, plus the estimate, within the limit."""
    w, limit = policy.params()
    cap = limit if policy.name == "sliding_log" else None
    counted: dict[int, int] = {}  # reservation time -> what it counts now
    for t, _, kind, x, y, z in steps:
        if kind == 1:
            at, estimate, actual = x, y, z
            if cap is not None:  # a log counts at most its limit per reservation
                estimate, actual = min(estimate, cap), min(actual, cap)
            counted[at] += actual - estimate
            continue
        estimate, allowed = x, y
        if not allowed:
            continue
        index, elapsed = divmod(t, w)
        if policy.name == "fixed_window":
            used, bound = sum(n for at, n in counted.items() if at // w == index) * w, limit * w
        elif policy.name == "sliding_log":
            used, bound = sum(n for at, n in counted.items() if at > t - w) * w, limit * w
        else:
            current = sum(n for at, n in counted.items() if at // w == index)
            previous = sum(n for at, n in counted.items() if at // w == index - 1)
            used, bound = previous * (w - elapsed) + current * w, limit * w
        assert used + estimate * w <= bound, (policy, t, used, estimate)
        counted[t] = estimate


def check_bucket(policy: Policy, steps: Sequence[Step]) -> None:
    """At each admission at t, for every earlier step s: a * (charged in [s, t) + estimate)
    <= a * capacity + (t - s), charged counting refunds and extra charges when settled."""
    a, capacity = policy.params()
    charged = 0  # everything charged before the step
    lowest = None  # min over steps s of a * charged(before s) - s
    for t, _, kind, x, y, z in steps:
        q = a * charged - t
        lowest = q if lowest is None else min(lowest, q)
        if kind == 1:
            charged += z - y
        elif y:
            assert q - lowest + a * x <= a * capacity, (policy, t, x)
            charged += x


def replay(policies: Sequence[Policy], metered: Sequence[Policy], steps: Sequence[Step]) -> int:
    """The model, step for step at the server's times: the same admissions. Returns how
    many were refused."""
    clock = FakeClock()
    model = SyncMemoryRateLimitBackend(clock=clock)
    refused = 0
    for t, _, kind, x, y, z in steps:
        set_us(clock, t)
        if kind == 1:
            charged = [y if p in metered else 1 for p in policies]
            actual = [z if p in metered else 1 for p in policies]
            model.settle("k", policies, x, charged, actual)
            continue
        costs = [x if p in metered else 1 for p in policies]
        decision, _ = model.reserve("k", policies, costs)
        assert (int(decision.allowed), decision.remaining) == (y, z), (policies, t, x)
        refused += not decision.allowed
    return refused


def _as_charged(policy: Policy, metered: bool, steps: Sequence[Step]) -> list[Step]:
    """The steps as ``policy`` sees them: a request policy is charged 1 and never settled."""
    if metered:
        return list(steps)
    return [(t, o, 0, 1, y, z) for t, o, kind, _, y, z in steps if kind == 0]


def test_processes_reserving_and_settling_never_pass_the_limit(redis_url: str) -> None:
    reports = _run(redis_url)
    for i, spec in enumerate(SPECS):
        policies, metered = settle_worker.policies_of(spec)
        steps = _steps([r[i] for r in reports])
        for policy in policies:
            charged = _as_charged(policy, policy in metered, steps)
            if policy.name in ("token_bucket", "leaky_bucket"):
                check_bucket(policy, charged)
            else:
                check_windows(policy, charged)
        settled = sum(1 for s in steps if s[2] == 1)
        refused = replay(policies, metered, steps)
        # Enough happened: many settles of each kind, and demand above the limit.
        assert settled >= 50, (policies, settled)
        assert refused >= 50, (policies, refused)
