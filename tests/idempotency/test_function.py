"""``idempotent_function`` on async functions: once per key, on SQLite + memory and
PostgreSQL + Redis."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from headway import (
    IdempotencyEvent,
    IdempotencyInProgress,
    IdempotencyKeyReused,
    LockLost,
    MemoryLockBackend,
    RecordStore,
    ResultNotSerializable,
    idempotent_function,
)
from headway.idempotency.arguments import CallIdentity
from headway.idempotency.callers import caller_id
from headway.idempotency.record import ClaimOutcome
from headway.idempotency.table import records
from tests.idempotency.functions import KITS, Kit, open_kit, resolve

pytestmark = pytest.mark.anyio


@pytest.fixture(params=KITS)
async def kit(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Kit]:
    urls = {} if request.param == "sqlite-memory" else resolve(request)
    opened = await open_kit(request.param, tmp_path, urls.__getitem__)
    try:
        yield opened
    finally:
        await opened.close()


class Events:
    """An ``on_event`` hook that keeps what it saw and wakes waiters on a count."""

    def __init__(self) -> None:
        self.seen: list[IdempotencyEvent] = []
        self._changed = asyncio.Event()

    async def __call__(self, event: IdempotencyEvent) -> None:
        self.seen.append(event)
        self._changed.set()

    def kinds(self) -> list[str]:
        return [e.kind for e in self.seen]

    async def until(self, kind: str, count: int) -> None:
        while self.kinds().count(kind) < count:
            self._changed.clear()
            await self._changed.wait()


async def test_many_tasks_one_key_wait_body_runs_once(kit: Kit) -> None:
    runs: list[str] = []
    calls: list[str] = []
    everyone_called = asyncio.Event()

    def key(order: str, amount: int) -> str:
        calls.append(order)
        if len(calls) == 60:
            everyone_called.set()
        return order

    @kit.decorator(key=key, on_conflict="wait", wait_timeout=30)
    async def charge(order: str, amount: int) -> dict[str, Any]:
        runs.append(order)
        await everyone_called.wait()  # every duplicate is in flight before the first ends
        return {"order": order, "amount": amount, "charge": len(runs)}

    results = await asyncio.gather(*(charge("o-1", 500) for _ in range(60)))
    assert runs == ["o-1"]
    assert results == [{"order": "o-1", "amount": 500, "charge": 1}] * 60


async def test_many_tasks_one_key_raise(kit: Kit) -> None:
    events = Events()
    runs = 0

    @kit.decorator(on_event=events)
    async def charge(order: str) -> str:
        nonlocal runs
        runs += 1
        await events.until("conflict", 39)  # holds the key until every duplicate was refused
        return f"charged {order}"

    results = await asyncio.gather(*(charge("o-2") for _ in range(40)), return_exceptions=True)
    refused = [r for r in results if isinstance(r, IdempotencyInProgress)]
    assert runs == 1
    assert len(refused) == 39
    assert [r for r in results if not isinstance(r, IdempotencyInProgress)] == ["charged o-2"]
    assert refused[0].key == events.seen[0].key
    assert await charge("o-2") == "charged o-2"  # a later call replays
    assert runs == 1
    assert events.kinds().count("replayed") == 1


async def test_events_of_a_first_call_and_a_replay(kit: Kit) -> None:
    seen: list[IdempotencyEvent] = []

    @kit.decorator(on_event=seen.append, namespace="billing.charge")
    async def charge(order: str) -> int:
        return 7

    assert await charge("o-3") == 7
    assert await charge("o-3") == 7
    assert [e.kind for e in seen] == ["claimed", "completed", "replayed"]
    assert {(e.caller, e.source) for e in seen} == {("billing.charge", "function")}
    assert len({e.key for e in seen}) == 1
    assert seen[0].fence is not None
    assert seen[0].fence == seen[1].fence == seen[2].fence


async def test_a_hook_that_raises_changes_nothing(kit: Kit) -> None:
    def broken(event: IdempotencyEvent) -> None:
        raise RuntimeError("metrics down")

    @kit.decorator(on_event=broken)
    async def double(x: int) -> int:
        return 2 * x

    assert await double(21) == 42
    assert await double(21) == 42


async def test_an_exception_releases_the_key_and_a_retry_runs(kit: Kit) -> None:
    events = Events()
    attempts: list[int] = []

    @kit.decorator(on_event=events)
    async def deliver(message_id: str) -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            raise ConnectionError("downstream refused")
        return "delivered"

    with pytest.raises(ConnectionError, match="downstream refused"):
        await deliver("m-1")
    assert await deliver("m-1") == "delivered"
    assert await deliver("m-1") == "delivered"
    assert attempts == [1, 2]
    assert events.kinds() == ["claimed", "released", "claimed", "completed", "replayed"]


class Declined(Exception):
    """A business outcome worth keeping: retrying will not change it."""


async def test_store_errors_are_stored_and_raised_again(kit: Kit) -> None:
    runs = 0

    @kit.decorator(store_errors=(Declined,))
    async def charge(order: str) -> str:
        nonlocal runs
        runs += 1
        raise Declined("card declined", order, 51)

    for _ in range(3):
        with pytest.raises(Declined) as raised:
            await charge("o-4")
        assert raised.value.args == ("card declined", "o-4", 51)
    assert runs == 1


@pytest.mark.parametrize(
    ("result", "named"),
    [
        (datetime.datetime(2026, 1, 1), "datetime.datetime"),
        ({"ids": {1, 2}}, "builtins.set"),
        ({1: "one"}, "dict key of type int"),
        (float("nan"), "NaN"),
    ],
)
async def test_a_result_json_cannot_hold_is_refused_and_released(
    kit: Kit, result: object, named: str
) -> None:
    events = Events()
    returns = [result, "fine"]

    @kit.decorator(on_event=events)
    async def compute(x: int) -> object:
        return returns.pop(0)

    with pytest.raises(ResultNotSerializable, match=named) as raised:
        await compute(1)
    assert isinstance(raised.value, TypeError)
    assert events.kinds() == ["claimed", "released"]
    async with kit.store.engine.connect() as conn:
        assert (await conn.execute(records.select())).all() == []  # nothing half stored
    assert await compute(1) == "fine"  # released: the retry runs


class IsoDates:
    """A serializer that keeps datetimes (as ISO text), to show the seam."""

    def dumps(self, value: Any) -> bytes:
        if not isinstance(value, datetime.datetime):
            raise TypeError(f"IsoDates stores datetimes, not {type(value).__name__}")
        return value.isoformat().encode()

    def loads(self, data: bytes) -> Any:
        return datetime.datetime.fromisoformat(data.decode())


async def test_a_pluggable_serializer(kit: Kit) -> None:
    runs = 0

    @kit.decorator(serializer=IsoDates())
    async def scheduled(job: str) -> datetime.datetime:
        nonlocal runs
        runs += 1
        return datetime.datetime(2026, 11, 24, 18, 0, runs)

    first = await scheduled("nightly")
    assert first == await scheduled("nightly") == datetime.datetime(2026, 11, 24, 18, 0, 1)
    assert runs == 1


async def test_every_caller_gets_what_was_stored(kit: Kit) -> None:
    @kit.decorator()
    async def pair(x: int) -> Any:  # a tuple, that JSON gives back as a list
        return (x, x + 1)

    assert await pair(1) == [1, 2]  # JSON has lists: the first caller sees what replays see
    assert await pair(1) == [1, 2]


async def test_the_same_key_with_other_arguments_is_refused(kit: Kit) -> None:
    events = Events()
    runs: list[int] = []

    @kit.decorator(key=lambda order, amount: order, on_event=events)
    async def charge(order: str, amount: int) -> int:
        runs.append(amount)
        return amount

    assert await charge("o-5", 100) == 100
    with pytest.raises(IdempotencyKeyReused) as raised:
        await charge("o-5", 999)
    assert raised.value.key == "o-5"
    assert runs == [100]
    assert events.kinds()[-1] == "key_reused"


async def test_default_key_binds_arguments_and_defaults(kit: Kit) -> None:
    runs = 0

    @kit.decorator()
    async def send(to: str, subject: str = "hello", *, urgent: bool = False) -> int:
        nonlocal runs
        runs += 1
        return runs

    assert await send("ann") == 1
    assert await send(to="ann", subject="hello") == 1
    assert await send("ann", urgent=False) == 1
    assert await send("ann", urgent=True) == 2
    assert await send("bob") == 3


async def test_namespaces_keep_keys_apart(kit: Kit) -> None:
    @kit.decorator(namespace="emails")
    async def email(user: int) -> str:
        return f"email {user}"

    @kit.decorator(namespace="texts")
    async def text(user: int) -> str:
        return f"text {user}"

    assert (await email(1), await text(1)) == ("email 1", "text 1")


async def test_a_result_expires_after_ttl(kit: Kit) -> None:
    runs = 0

    @kit.decorator(ttl=2.0)
    async def job(day: str) -> int:
        nonlocal runs
        runs += 1
        return runs

    assert await job("2026-11-24") == 1
    assert await job("2026-11-24") == 1  # well within the 2 s
    await asyncio.sleep(2.5)  # past the TTL on the database clock, with a margin
    assert await job("2026-11-24") == 2


async def test_the_lease_is_renewed_while_the_body_runs(kit: Kit) -> None:
    inside = asyncio.Event()

    @kit.decorator(lease_ttl=1.0)
    async def slow(x: int) -> int:
        inside.set()
        await asyncio.sleep(2.2)  # more than two lease lengths
        return x

    first = asyncio.ensure_future(slow(1))
    await inside.wait()
    await asyncio.sleep(1.5)  # the first 1 s leases ended 0.5 s ago, unless renewed
    with pytest.raises(IdempotencyInProgress):
        await slow(1)
    assert await first == 1


async def test_a_superseded_completion_is_rejected_by_the_fence(kit: Kit) -> None:
    @kit.decorator()
    async def work(x: int) -> int:
        # Another worker took the record over meanwhile (its lease had lapsed).
        async with kit.store.engine.begin() as conn:
            await conn.execute(records.update().values(fence=records.c.fence + 1000))
        return x

    with pytest.raises(LockLost, match="superseded"):
        await work(1)
    async with kit.store.engine.connect() as conn:
        (status, body), *_ = (
            await conn.execute(records.select().with_only_columns(
                records.c.status, records.c.response_body
            ))
        ).all()  # fmt: skip
    assert (status, body) == ("PROCESSING", None)  # the newer worker's record is untouched


async def test_arguments_without_a_stable_form_are_refused_before_running(kit: Kit) -> None:
    runs = 0

    class Session:
        pass

    @kit.decorator()
    async def save(session: Session, item: str) -> str:
        nonlocal runs
        runs += 1
        return item

    with pytest.raises(TypeError, match=r"argument 'session' .*Session.*ignore=\('session',\)"):
        await save(Session(), "a")
    assert runs == 0

    @kit.decorator(ignore=("session",))
    async def save_ignoring(session: Session, item: str) -> str:
        nonlocal runs
        runs += 1
        return item

    assert await save_ignoring(Session(), "a") == await save_ignoring(Session(), "a") == "a"
    assert runs == 1


@pytest.mark.parametrize(
    ("key", "error"),
    [(lambda x: "k" * 256, ValueError), (lambda x: 42, TypeError), (lambda x: "", ValueError)],
)
async def test_bad_keys_are_refused_before_running(kit: Kit, key: Any, error: type) -> None:
    @kit.decorator(key=key)
    async def work(x: int) -> int:
        raise AssertionError("must not run")

    with pytest.raises(error):
        await work(1)


@pytest.mark.parametrize(
    "options",
    [
        {"on_conflict": "maybe"},
        {"lease_ttl": 0},
        {"ttl": -1},
        {"wait_timeout": -1},
        {"store_errors": (KeyboardInterrupt,)},
    ],
)
def test_bad_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError)):
        idempotent_function(**options)


def test_ignore_must_name_parameters(tmp_path: Path) -> None:
    decorator = idempotent_function(store=None, ignore=("sesion",))
    with pytest.raises(ValueError, match="sesion"):

        @decorator
        def save(session: object) -> None: ...


async def test_a_dead_processs_record_is_taken_over_by_one_with_a_fresh_lock(
    store: RecordStore,
) -> None:
    """A process restarted on the embedded setup has a new in-memory lock, whose fences
    start again from 1. The record a dead process left (here under its lock's millionth
    fence, as a lock-fenced claim wrote it) must still be taken over once its lease is over:
    the takeover asks for the lapsed record lease, not for a larger lock fence."""
    runs: list[str] = []

    @idempotent_function(store=store, lock_backend=MemoryLockBackend(), namespace="restart")
    async def charge(order: str) -> str:
        runs.append(order)
        return order

    key, fingerprint = CallIdentity(charge.__wrapped__, None, ())(("o-1",), {})  # type: ignore[attr-defined]
    caller = caller_id("function:restart")
    dead = await store.claim(
        caller, key, fingerprint, fence=10**6, lease_token="dead", lease_ttl=0.2
    )
    assert dead.outcome is ClaimOutcome.CLAIMED
    with pytest.raises(IdempotencyInProgress):
        await charge("o-1")  # the dead process's lease still lives
    deadline = asyncio.get_running_loop().time() + 5
    while True:
        try:
            assert await charge("o-1") == "o-1"
            break
        except IdempotencyInProgress:
            assert asyncio.get_running_loop().time() < deadline, "the dead record is stuck"
            await asyncio.sleep(0.05)  # the lease ends on the database clock: polled
    assert runs == ["o-1"]
