"""A lock holder in its own OS process, for the session-expiry test.

It holds one lock with ``hold()`` (renewing) and reports on stdout: ``held <fence>``
once inside the block, then ``lost <fence> <reason>`` when ``hold()`` raises
``LockLost``, or ``kept`` if the block ran out without loss (it waits 30 s).

Usage: python -m tests.lock.backends.zookeeper.holder HOSTS PREFIX RESOURCE SESSION TTL
"""

from __future__ import annotations

import asyncio
import sys

from headway import Lock, LockLost, ZooKeeperLockBackend


async def main(hosts: str, prefix: str, resource: str, session: float, ttl: float) -> None:
    backend = ZooKeeperLockBackend(hosts, session_timeout=session, prefix=prefix)
    lock = Lock(backend, resource, ttl=ttl, timeout=10)
    fence = 0
    try:
        async with lock.hold() as lease:
            fence = lease.fence
            print(f"held {fence}", flush=True)
            await asyncio.sleep(30)
        print("kept", flush=True)
    except LockLost as exc:
        print(f"lost {fence} {exc}", flush=True)
    finally:
        await backend.aclose()


if __name__ == "__main__":
    hosts, prefix, resource, session, ttl = sys.argv[1:6]
    asyncio.run(main(hosts, prefix, resource, float(session), float(ttl)))
