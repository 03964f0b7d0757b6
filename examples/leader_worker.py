"""A leader-only worker: every replica runs it, one replica at a time does the work.

Three replicas of a service (three tasks here; processes or hosts in production) campaign
in one ``Election``. The leader dispatches batches from an outbox; each write is fenced
with its term, so a leader that lost its lease (a pause, a partition) cannot write after
its successor. SIGTERM (a deploy) makes the leader resign at once, so the next replica
takes over without waiting for the lease to run out; a leader that has dispatched its
share steps down the same way, by leaving its block.

Run: ``python3 -m uv run python examples/leader_worker.py`` (uses HEADWAY_REDIS_URL if
set, else the in-memory backend).
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

from redis.asyncio import Redis

import headway

BATCHES_PER_TERM = 3
TERMS = 3


def make_backend() -> headway.LockBackend:
    url = os.environ.get("HEADWAY_REDIS_URL")
    if url:
        return headway.RedisLockBackend(Redis.from_url(url))
    return headway.MemoryLockBackend()


class Outbox:
    """Where the leader writes: it keeps the highest term it has seen and refuses lower
    ones (a SQL table does the same with ``headway.fenced_update``)."""

    def __init__(self) -> None:
        self.top = 0
        self.sent: list[tuple[int, str]] = []

    def write(self, term: int, batch: str) -> bool:
        if term < self.top:
            return False  # a stale leader: refused
        self.top = term
        self.sent.append((term, batch))
        return True


async def lead(name: str, term: headway.Leadership, outbox: Outbox) -> None:
    """The leader-only work: dispatch a few batches."""
    for n in range(BATCHES_PER_TERM):
        if not outbox.write(term.term, f"{name}/{n}"):
            raise RuntimeError("fenced out: a newer leader has written")
        if term.term == outbox.sent[0][0] and n == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # the first leader is deployed away
        await asyncio.sleep(0.02)  # the next batch's turn


async def replica(
    name: str, election: headway.Election, outbox: Outbox, done: asyncio.Event
) -> None:
    loop = asyncio.get_running_loop()
    while not done.is_set():
        try:
            async with election.campaign() as term:
                if done.is_set():
                    break  # elected after the work was done: leave at once
                print(f"{name}: leads, term {term.term}")
                loop.add_signal_handler(signal.SIGTERM, term.resign)  # SIGTERM: resign now
                try:
                    await lead(name, term, outbox)
                finally:
                    loop.remove_signal_handler(signal.SIGTERM)
                    how = "resigns (SIGTERM)" if term.resigned else "steps down"
                    print(f"{name}: {how}")
                    if len({t for t, _ in outbox.sent}) >= TERMS:
                        done.set()  # before leaving: the next leader sees it
        except headway.LockLost:  # the lease could not be renewed: the block was cancelled
            print(f"{name}: lost its lease, campaigning again")


async def main() -> None:
    backend = make_backend()
    outbox = Outbox()
    done = asyncio.Event()
    name = f"outbox-dispatcher-{uuid.uuid4().hex[:8]}"  # a fresh election per run
    replicas = [
        replica(
            f"replica-{i}", headway.Election(backend, name, identity=f"replica-{i}"), outbox, done
        )
        for i in range(3)
    ]
    await asyncio.gather(*replicas)
    terms = [term for term, _ in outbox.sent]
    assert terms == sorted(terms), "terms rise with every leader"
    print(f"{len(outbox.sent)} batches in {len(set(terms))} terms")


if __name__ == "__main__":
    asyncio.run(main())
