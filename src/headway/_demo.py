"""``headway demo``: short scenes on the embedded defaults (no server needed)."""

from __future__ import annotations

import asyncio
import json
import tempfile

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import StaticPool

from headway._demo_function import function_scene
from headway._demo_ratelimit import Say, ratelimit_scene
from headway._http import ASGIApp, Message, Receive, Scope, Send, send_response
from headway.lock.backends.memory import MemoryLockBackend
from headway.lock.fencing import fenced_update
from headway.lock.lease import Lease
from headway.lock.lock import Lock


class Register:
    """One SQLite row written only through ``fenced_update``: stale tokens are rejected."""

    def __init__(self) -> None:
        self.engine = create_async_engine("sqlite+aiosqlite:///:memory:", poolclass=StaticPool)
        self.table = sa.Table(
            "account",
            sa.MetaData(),
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("balance", sa.Integer, nullable=False),
            sa.Column("fence", sa.BigInteger, nullable=False),
        )

    async def open(self) -> None:
        async with self.engine.begin() as conn:
            await conn.run_sync(self.table.metadata.create_all)
            await conn.execute(self.table.insert().values(id=1, balance=0, fence=0))

    async def read(self) -> tuple[int, int]:
        async with self.engine.connect() as conn:
            row = (await conn.execute(sa.select(self.table.c.balance, self.table.c.fence))).one()
        return row.balance, row.fence

    async def write(self, balance: int, fence: int) -> bool:
        async with self.engine.begin() as conn:
            return await fenced_update(
                conn, self.table, {"id": 1}, {"balance": balance}, fence=fence
            )


async def lock_scene(say: Say) -> None:
    """Workers contend for one lock over a fenced SQLite row; a paused holder is rejected."""
    say("== lock: 4 workers, one resource, on the in-memory backend ==")
    backend = MemoryLockBackend()
    lock = Lock(backend, "account:42", ttl=1.0, timeout=5.0)
    register = Register()
    await register.open()

    async def worker(name: str) -> None:
        for _ in range(3):
            async with lock.hold() as lease:
                before, _ = await register.read()
                await asyncio.sleep(0.01)  # the critical section's work
                ok = await register.write(before + 1, lease.fence)
                say(f"  {name} fence {lease.fence:>2}  balance {before} -> {before + 1}  {_ok(ok)}")

    await asyncio.gather(*(worker(f"worker-{i}") for i in range(1, 5)))
    balance, _ = await register.read()
    say(f"  12 critical sections, final balance {balance}: none lost, none overlapped")

    say("")
    say("== lock: a holder pauses past its lease ==")
    slow = Lock(backend, "account:42", ttl=0.2)
    paused = await slow.acquire()
    say(f"  slow    fence {paused.fence:>2}  acquired, then stalls (GC pause, swap...) for 0.4 s")
    await asyncio.sleep(0.4)  # longer than its 0.2 s lease
    fresh: Lease = await slow.acquire(timeout=1.0)
    balance, _ = await register.read()
    ok = await register.write(balance + 1, fresh.fence)
    say(f"  fast    fence {fresh.fence:>2}  took over the expired lease, writes: {_ok(ok)}")
    ok = await register.write(balance + 100, paused.fence)
    say(f"  slow    fence {paused.fence:>2}  wakes up and writes late:           {_ok(ok)}")
    await slow.release(fresh)
    balance, fence = await register.read()
    say(f"  the SQLite row kept fence {fence} and balance {balance}")
    await register.engine.dispose()


async def _call(
    app: ASGIApp, body: bytes, key: str, caller: str | None = "alice"
) -> tuple[int, dict[str, str], bytes]:
    """One POST through an ASGI app, in process, by ``caller``'s bearer token (or none)."""
    sending = [(b"idempotency-key", key.encode()), (b"content-type", b"application/json")]
    if caller is not None:
        sending.append((b"authorization", f"Bearer {caller}".encode()))
    scope = {
        "type": "http", "method": "POST", "path": "/payments", "raw_path": b"/payments",
        "query_string": b"", "client": ("127.0.0.1", 1), "scheme": "http", "headers": sending,
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
    """A retry replayed, a concurrent duplicate refused, a reused key rejected; another
    caller's key is its own; a caller without credentials is never replayed."""
    from headway.idempotency.middleware import IdempotencyMiddleware
    from headway.idempotency.store import RecordStore

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
        status, _, body = await _call(app, b'{"amount": 100}', '"order-1"', caller="bob")
        say(f"  {'bob, the same key':<26} -> {status} {body.decode()}")
        for what in ("no credentials, key x-1", "no credentials, retry"):
            status, _, body = await _call(app, b'{"amount": 5}', '"x-1"', caller=None)
            answer = body.decode() if status < 300 else json.loads(body)["type"]
            say(f"  {what:<26} -> {status} {answer}")
        await store.aclose()
    say(f"  cards charged {len(charges)} times for 8 requests: {charges}")


def _ok(accepted: bool) -> str:
    return "accepted" if accepted else "REJECTED (stale fencing token)"


SCENES = {
    "lock": lock_scene,
    "ratelimit": ratelimit_scene,
    "idempotency": idempotency_scene,
    "function": function_scene,
}


async def run(scenes: list[str], say: Say = print) -> None:
    """Play the named scenes in order."""
    for i, name in enumerate(scenes):
        if i:
            say("")
        await SCENES[name](say)
