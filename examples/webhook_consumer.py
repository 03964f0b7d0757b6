"""A webhook consumer: deliveries come at least once; each event's effects happen once.

Payment providers redeliver webhooks (a timeout, a restart), sometimes while the first
delivery is still being processed. Here 4 workers drain a queue holding every event
three times, in random order; ``fulfil`` is an idempotent function keyed by the event's
id, so each order ships once and every delivery gets the same answer. A downstream
failure releases the key, so the provider's next redelivery runs it again.

Run: ``python3 -m uv run python examples/webhook_consumer.py``. Uses
HEADWAY_DATABASE_URL (run ``headway migrate`` on it first) and HEADWAY_REDIS_URL if
set, else a SQLite file in a temporary folder and the in-memory lock.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import uuid
from typing import Any

from redis.asyncio import Redis

import headway

RUN = uuid.uuid4().hex[:4]  # fresh event ids per run, as a provider would send
EVENTS = [
    {"id": f"evt_{RUN}_{n}", "type": "payment.succeeded", "order": 1000 + n} for n in range(4)
]


def make_store(folder: str) -> headway.RecordStore:
    url = os.environ.get("HEADWAY_DATABASE_URL")
    return headway.RecordStore.from_url(url or f"sqlite+aiosqlite:///{folder}/webhooks.sqlite3")


def make_lock() -> headway.LockBackend:
    url = os.environ.get("HEADWAY_REDIS_URL")
    return headway.RedisLockBackend(Redis.from_url(url)) if url else headway.MemoryLockBackend()


async def consume(store: headway.RecordStore, lock: headway.LockBackend) -> None:
    shipped: list[int] = []
    outages = {EVENTS[2]["id"]}  # the warehouse API fails once for this event

    @headway.idempotent_function(
        store=store,
        lock_backend=lock,
        namespace="webhooks.fulfil",
        key=lambda event: event["id"],
        on_conflict="wait",  # a redelivery while the first runs waits for its result
    )
    async def fulfil(event: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.05)  # the warehouse API's latency
        if event["id"] in outages:
            outages.discard(event["id"])
            raise ConnectionError("warehouse unavailable")
        shipped.append(event["order"])
        return {"order": event["order"], "shipment": f"shp_{len(shipped)}"}

    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for event in random.sample(EVENTS * 3, k=len(EVENTS) * 3):
        queue.put_nowait(event)
    answers: dict[str, set[str]] = {}

    async def worker() -> None:
        while not queue.empty():
            event = queue.get_nowait()
            try:
                result = await fulfil(event)
            except ConnectionError as exc:
                print(f"  {event['id']}: {exc}; left for the next redelivery")
                continue
            answers.setdefault(event["id"], set()).add(result["shipment"])

    await asyncio.gather(*(worker() for _ in range(4)))
    for event_id, shipments in sorted(answers.items()):
        print(f"  {event_id}: every delivery answered {sorted(shipments)}")
    print(f"{len(EVENTS) * 3} deliveries of {len(EVENTS)} events: {len(shipped)} orders shipped")


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        store, lock = make_store(folder), make_lock()
        try:
            await consume(store, lock)
        finally:
            await store.aclose()
            if isinstance(lock, headway.RedisLockBackend):
                await lock.aclose()


if __name__ == "__main__":
    asyncio.run(main())
