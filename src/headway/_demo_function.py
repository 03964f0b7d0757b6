"""``headway demo function``: idempotent functions on SQLite and the in-memory lock."""

from __future__ import annotations

import asyncio
import datetime
import tempfile
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from headway._demo_ratelimit import Say
from headway._errors import IdempotencyInProgress, IdempotencyKeyReused, ResultNotSerializable
from headway.idempotency.function import idempotent_function
from headway.idempotency.portal import submit
from headway.idempotency.store import RecordStore
from headway.lock.backends.memory import MemoryLockBackend


async def function_scene(say: Say) -> None:
    """Duplicates run once, failures release the key, what cannot be stored is refused."""
    say("== idempotent functions: a queue consumer on SQLite and the in-memory lock ==")
    with tempfile.TemporaryDirectory() as tmp:
        store = RecordStore.from_url(f"sqlite+aiosqlite:///{tmp}/demo.sqlite3")
        try:
            await _async_calls(say, store)
        finally:
            await store.aclose()
    with tempfile.TemporaryDirectory() as tmp:
        _threads(say, f"sqlite+aiosqlite:///{tmp}/demo.sqlite3")


async def _async_calls(say: Say, store: RecordStore) -> None:
    events: list[str] = []
    sent: list[str] = []
    down = {"m-3"}  # the mail server fails once for this message
    deliveries: list[str] = []
    proceed, all_in = asyncio.Event(), asyncio.Event()

    def message_id(message: dict[str, Any]) -> str:
        deliveries.append(message["id"])
        if deliveries.count("m-2") == 5:
            all_in.set()
        return str(message["id"])

    options: dict[str, Any] = {
        "store": store, "lock_backend": MemoryLockBackend(),
        "on_event": lambda e: events.append(e.kind),
    }  # fmt: skip

    @idempotent_function(key=message_id, on_conflict="wait", **options)
    async def send_invoice(message: dict[str, Any]) -> dict[str, Any]:
        await proceed.wait()
        if message["id"] in down:
            down.discard(message["id"])
            raise ConnectionError("mail server timed out")
        sent.append(message["id"])
        return {"invoice": message["id"], "emails_sent": len(sent)}

    def show(what: str, outcome: object) -> None:
        say(f"  {what:<36} -> {outcome}  [{', '.join(events)}]")
        events.clear()

    proceed.set()
    show("message m-1 delivered", await send_invoice({"id": "m-1"}))
    show("m-1 redelivered", await send_invoice({"id": "m-1"}))
    proceed.clear()
    five = asyncio.gather(*(send_invoice({"id": "m-2"}) for _ in range(5)))
    await all_in.wait()  # the five are in flight: one runs, four wait for it
    proceed.set()
    answers = await five
    show("m-2 delivered 5 times at once", f"{len({str(a) for a in answers})} distinct answer")
    await _failures(show, send_invoice)
    await _unstorable(show, options)
    say(f"  emails sent: {len(sent)} for {len(deliveries)} deliveries of 3 messages")


async def _failures(
    show: Callable[[str, object], None],
    send_invoice: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
) -> None:
    """A failed run is not stored (the redelivery runs again); another body is refused."""
    for attempt in ("m-3 (mail server down)", "m-3 redelivered"):
        try:
            show(attempt, await send_invoice({"id": "m-3"}))
        except ConnectionError as exc:
            show(attempt, f"ConnectionError: {exc}")
    try:
        await send_invoice({"id": "m-1", "amount": 5})
    except IdempotencyKeyReused:
        show("m-1 again with another body", "IdempotencyKeyReused")


async def _unstorable(show: Callable[[str, object], None], options: dict[str, Any]) -> None:
    """A result the default serializer (JSON) cannot hold: refused, the key released."""

    @idempotent_function(**options)
    async def due_date(invoice: str) -> datetime.date:
        return datetime.date(2026, 12, 1)

    try:
        await due_date("m-1")
    except ResultNotSerializable as exc:
        show("a result JSON cannot hold", f"ResultNotSerializable ({exc.__cause__})")


def _threads(say: Say, url: str) -> None:
    """A sync function called from plain threads; a duplicate told to raise."""
    store = RecordStore.from_url(url)
    started, proceed = threading.Event(), threading.Event()
    runs: list[str] = []

    @idempotent_function(store=store, on_conflict="raise")
    def export_report(day: str) -> str:
        runs.append(day)
        started.set()
        proceed.wait(10)
        return f"report-{day}.csv"

    first: list[str] = []
    thread = threading.Thread(target=lambda: first.append(export_report("2026-11-24")))
    thread.start()
    started.wait(10)
    try:
        export_report("2026-11-24")
    except IdempotencyInProgress:
        say(f"  {'sync, 2nd thread while the 1st runs':<36} -> IdempotencyInProgress")
    proceed.set()
    thread.join(10)
    again = export_report("2026-11-24")
    say(f"  {'sync, after the 1st thread':<36} -> {again} (ran {len(runs)} time)")
    submit(store.aclose()).result()  # the store lives on the sync functions' loop
