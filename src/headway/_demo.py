"""``headway demo``: short scenes on the embedded defaults (no server needed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ._demo_ratelimit import ratelimit_scene
from .lock import Lease, Lock, MemoryLockBackend

Say = Callable[[str], None]


class FencedRegister:
    """A value that accepts a write only with a fencing token at least as new as the last."""

    def __init__(self) -> None:
        self.value = 0
        self.fence = 0

    def write(self, value: int, fence: int) -> bool:
        if fence < self.fence:
            return False
        self.value, self.fence = value, fence
        return True


async def lock_scene(say: Say) -> None:
    """Workers contend for one lock; a paused holder's late write is rejected."""
    say("== lock: 4 workers, one resource, on the in-memory backend ==")
    backend = MemoryLockBackend()
    lock = Lock(backend, "account:42", ttl=1.0, timeout=5.0)
    register = FencedRegister()

    async def worker(name: str) -> None:
        for _ in range(3):
            async with lock.hold() as lease:
                before = register.value
                await asyncio.sleep(0.01)  # the critical section's work
                ok = register.write(before + 1, lease.fence)
                say(f"  {name} fence {lease.fence:>2}  balance {before} -> {before + 1}  {_ok(ok)}")

    await asyncio.gather(*(worker(f"worker-{i}") for i in range(1, 5)))
    say(f"  12 critical sections, final balance {register.value}: none lost, none overlapped")

    say("")
    say("== lock: a holder pauses past its lease ==")
    slow = Lock(backend, "account:42", ttl=0.2)
    paused = await slow.acquire()
    say(f"  slow    fence {paused.fence:>2}  acquired, then stalls (GC pause, swap...) for 0.4 s")
    await asyncio.sleep(0.4)  # longer than its 0.2 s lease
    fresh: Lease = await slow.acquire(timeout=1.0)
    ok = register.write(register.value + 1, fresh.fence)
    say(f"  fast    fence {fresh.fence:>2}  took over the expired lease, writes: {_ok(ok)}")
    ok = register.write(register.value + 100, paused.fence)
    say(f"  slow    fence {paused.fence:>2}  wakes up and writes late:           {_ok(ok)}")
    await slow.release(fresh)
    say(f"  the register kept fence {register.fence} and balance {register.value}")


def _ok(accepted: bool) -> str:
    return "accepted" if accepted else "REJECTED (stale fencing token)"


SCENES = {"lock": lock_scene, "ratelimit": ratelimit_scene}


async def run(scenes: list[str], say: Say = print) -> None:
    """Play the named scenes in order."""
    for i, name in enumerate(scenes):
        if i:
            say("")
        await SCENES[name](say)
