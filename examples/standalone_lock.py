"""A lock from plain async code: workers share one account, writes are fenced.

Run: ``python3 -m uv run python examples/standalone_lock.py`` (uses HEADWAY_REDIS_URL if
set, else the in-memory backend).
"""

from __future__ import annotations

import asyncio
import os

from redis.asyncio import Redis

import headway


def make_backend() -> headway.LockBackend:
    url = os.environ.get("HEADWAY_REDIS_URL")
    if url:
        return headway.RedisLockBackend(Redis.from_url(url))
    return headway.MemoryLockBackend()


async def main() -> None:
    lock = headway.Lock(make_backend(), "account:42", ttl=5, timeout=10)
    balance = 0
    last_fence = 0

    async def deposit(amount: int) -> None:
        nonlocal balance, last_fence
        async with lock.hold() as lease:
            # A real store would do this check itself (UPDATE ... WHERE fence <= :fence).
            assert lease.fence > last_fence, "stale fencing token"
            last_fence = lease.fence
            current = balance
            await asyncio.sleep(0.001)
            balance = current + amount

    await asyncio.gather(*(deposit(10) for _ in range(50)))
    print(f"balance {balance} after 50 deposits of 10, last fencing token {last_fence}")


if __name__ == "__main__":
    asyncio.run(main())
