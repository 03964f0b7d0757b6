"""Each hook's events reach both exporters with the documented names and labels.

Real sources: the rate-limit middleware in front of a Starlette app, ``Lock`` over
the in-memory backend, Redis backends pointed at a port nothing listens on (a real
refused connection, not a mock), idempotency events as the ``IdempotencyHook``
contract delivers them.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from headway import (
    BackendUnavailable,
    FixedWindow,
    IdempotencyEvent,
    Lock,
    LockNotAcquired,
    LockNotOwned,
    MemoryLockBackend,
    RateLimitMiddleware,
    RedisLockBackend,
    RedisRateLimitBackend,
    Rule,
)
from tests.metrics.conftest import Exported
from tests.servers import free_port
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio

SECRET = "203.0.113.77"  # a client address: must never become a label


def app_with(exported: Exported, rule: Rule, backend: object = None) -> httpx.AsyncClient:
    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("hi")

    app = RateLimitMiddleware(
        Starlette(routes=[Route("/", hello)]),
        rules=[rule],
        backend=backend,  # type: ignore[arg-type]
        on_decision=exported.metrics.on_decision,
    )
    transport = httpx.ASGITransport(app=app, client=(SECRET, 1234))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def test_decisions_and_refusals_are_counted_by_rule_and_outcome(exported: Exported) -> None:
    async with app_with(
        exported, Rule(FixedWindow(limit=2, window=NO_ROLLOVER), name="api")
    ) as client:
        statuses = [(await client.get("/")).status_code for _ in range(5)]
    assert statuses == [200, 200, 429, 429, 429]
    decisions = "headway_ratelimit_decisions"
    assert exported.count(decisions, rule="api", outcome="allowed", shadow="false") == 2
    assert exported.count(decisions, rule="api", outcome="rejected", shadow="false") == 3
    assert exported.count("headway_ratelimit_refusals", rule="api", status="429") == 3
    assert exported.label_names() <= {"rule", "outcome", "shadow", "status"}


async def test_a_backend_that_fails_counts_an_error_and_a_503(exported: Exported) -> None:
    down = RedisRateLimitBackend.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
    rule = Rule(FixedWindow(limit=2, window=NO_ROLLOVER, on_error="deny"), name="strict")
    async with app_with(exported, rule, down) as client:
        assert (await client.get("/")).status_code == 503
    await down.client.aclose()
    assert exported.count("headway_ratelimit_decisions", rule="strict", outcome="errored",
                          shadow="false") == 1  # fmt: skip
    assert exported.count("headway_ratelimit_refusals", rule="strict", status="503") == 1
    errors = exported.count(
        "headway_backend_errors", component="ratelimit", backend="ratelimit:strict"
    )
    assert errors == 1


async def test_lock_waits_and_hold_times_are_observed(exported: Exported) -> None:
    lock = Lock(MemoryLockBackend(), "invoice-42", ttl=5, on_event=exported.metrics.on_lock)
    lease = await lock.acquire()
    with pytest.raises(LockNotAcquired):
        await lock.acquire(timeout=0.05)
    await asyncio.sleep(0.02)  # held at least this long
    await lock.release(lease)
    wait, hold = "headway_lock_wait", "headway_lock_hold"
    assert exported.count(wait, backend="memory", outcome="acquired") == 1
    assert exported.count(wait, backend="memory", outcome="not_acquired") == 1
    assert exported.total(wait, backend="memory", outcome="not_acquired") >= 0.05
    assert exported.count(hold, backend="memory", outcome="released") == 1
    assert exported.total(hold, backend="memory", outcome="released") >= 0.02
    assert "invoice-42" not in str(exported.label_names())


async def test_a_lapsed_lease_is_counted_as_lost(exported: Exported) -> None:
    lock = Lock(MemoryLockBackend(), "r", ttl=0.05, on_event=exported.metrics.on_lock)
    lease = await lock.acquire()
    await asyncio.sleep(0.2)  # past the TTL, with a margin
    with pytest.raises(LockNotOwned):
        await lock.release(lease)
    assert exported.count("headway_lock_hold", backend="memory", outcome="lost") == 1


async def test_a_lock_backend_that_fails_counts_an_error(exported: Exported) -> None:
    down = RedisLockBackend.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
    lock = Lock(down, "r", on_event=exported.metrics.on_lock)
    with pytest.raises(BackendUnavailable):
        await lock.acquire(timeout=0.1)
    await down.aclose()
    await down.client.aclose()
    assert exported.count("headway_backend_errors", component="lock", backend="redis") == 1
    assert exported.count("headway_lock_wait", backend="redis", outcome="errored") == 1


def test_idempotency_outcomes_are_counted_without_keys(exported: Exported) -> None:
    for kind in ("claimed", "completed", "replayed", "replayed", "conflict"):
        exported.metrics.on_idempotency(IdempotencyEvent(kind, "tenant-9", "key-123", "http"))
    events = "headway_idempotency_events"
    assert exported.count(events, kind="replayed", source="http") == 2
    assert exported.count(events, kind="conflict", source="http") == 1
    assert exported.label_names() == {"kind", "source"}
