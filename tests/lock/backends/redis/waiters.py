"""Waiters queued in Redis as another process would queue them."""

from __future__ import annotations

from redis import asyncio as aioredis

from headway.lock.backends.redis.keys import ACQUIRE, acquire_call
from headway.lock.flow import Attempt, Try, waiter_id


async def queue_raw_waiter(client: aioredis.Redis, resource: str, token: str) -> str:
    """Queue a waiter as another process would, without anybody listening for it."""
    step = Try(token, 30_000, waiter_id(token, 30_000), 60_000)
    keys, args = acquire_call(resource, step)
    assert not Attempt.from_reply(await ACQUIRE.run(client, keys, args)).granted
    return step.waiter
