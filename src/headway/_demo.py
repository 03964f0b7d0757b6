"""``headway demo``: short scenes on the embedded defaults (no server needed)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable

from ._http import ASGIApp, Message, Receive, Scope, Send, send_response
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


async def _call(app: ASGIApp, body: bytes, key: str) -> tuple[int, dict[str, str], bytes]:
    """One POST through an ASGI app, in process."""
    scope = {
        "type": "http", "method": "POST", "path": "/payments", "raw_path": b"/payments",
        "query_string": b"", "client": ("127.0.0.1", 1), "scheme": "http",
        "headers": [(b"idempotency-key", key.encode()), (b"content-type", b"application/json")],
    }  # fmt: skip
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    headers = {k.decode(): v.decode() for k, v in sent[0].get("headers", ())}
    return sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


async def idempotency_scene(say: Say) -> None:
    """A retry replayed, a concurrent duplicate refused, a reused key rejected."""
    from .idempotency import IdempotencyMiddleware, RecordStore

    say("== idempotency: POST /payments on SQLite and the in-memory lock ==")
    charges: list[int] = []
    started, proceed = asyncio.Event(), asyncio.Event()

    async def payments(scope: Scope, receive: Receive, send: Send) -> None:
        amount = json.loads((await receive())["body"])["amount"]
        started.set()
        await proceed.wait()
        charges.append(amount)
        body = json.dumps({"charge": len(charges), "amount": amount}).encode()
        await send_response(send, 201, [(b"content-type", b"application/json")], body)

    with tempfile.TemporaryDirectory() as tmp:
        store = RecordStore.from_url(f"sqlite+aiosqlite:///{tmp}/demo.sqlite3")
        app = IdempotencyMiddleware(payments, store=store)
        proceed.set()
        for what in ("first request", "retry (same key)"):
            status, headers, body = await _call(app, b'{"amount": 100}', '"order-1"')
            replayed = "  Idempotent-Replayed: true" if "idempotent-replayed" in headers else ""
            say(f"  {what:<26} -> {status} {body.decode()}{replayed}")
        proceed.clear()
        started.clear()
        first = asyncio.ensure_future(_call(app, b'{"amount": 250}', '"order-2"'))
        await started.wait()
        status, _, body = await _call(app, b'{"amount": 250}', '"order-2"')
        say(f"  {'duplicate while in flight':<26} -> {status} {json.loads(body)['type']}")
        proceed.set()
        status, _, body = await first
        say(f"  {'the first one finishes':<26} -> {status} {body.decode()}")
        status, _, body = await _call(app, b'{"amount": 999}', '"order-1"')
        say(f"  {'same key, new body':<26} -> {status} {json.loads(body)['type']}")
        await store.aclose()
    say(f"  cards charged {len(charges)} times for 5 requests: {charges}")


def _ok(accepted: bool) -> str:
    return "accepted" if accepted else "REJECTED (stale fencing token)"


SCENES = {"lock": lock_scene, "idempotency": idempotency_scene}


async def run(scenes: list[str], say: Say = print) -> None:
    """Play the named scenes in order."""
    for i, name in enumerate(scenes):
        if i:
            say("")
        await SCENES[name](say)
