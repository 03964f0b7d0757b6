"""Idempotency benchmark: replay latency against a primary-key SELECT, first-execution
overhead over the bare endpoint, and throughput beside asgi-idempotency-header and
fastapi-idempotency.

    uv run --group bench python benchmarks/idempotency_bench.py [--quick]

Every app is called in process as raw ASGI (no HTTP client, no server), so what is
measured is the middleware and its storage round trips. headway's store is
``RecordStore.from_url(url)`` exactly as a user writes it (its own engine and default
pool, nothing tuned); the baseline SELECT runs on a plain ``create_async_engine(url)``
(asyncpg). Redis is a private ``redis-server`` started through tests/servers.py, so its
``INFO commandstats`` counts only this run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import redis
import sqlalchemy as sa
from _idem_apps import BUILDERS, SUBJECTS
from _stats import Samples
from redis import asyncio as aioredis
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from headway import RecordStore
from headway._redis.connection import PipelinedConnection
from headway.idempotency.table import records

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.idempotency.statements import Statements
from tests.servers import private_redis

DATABASE_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/hw_ibench"
BODY = b'{"amount": 100}'


@dataclass(frozen=True)
class Config:
    rounds: int
    sequential: int  # timed requests per latency row and round
    concurrent: int  # requests per throughput row and round
    tasks: int = 16
    replay_keys: int = 64  # distinct keys the replay throughput cycles through
    warmup: int = 50


FULL = Config(rounds=3, sequential=1000, concurrent=2000)
QUICK = Config(rounds=1, sequential=200, concurrent=400, warmup=20)


# -- raw ASGI calls --------------------------------------------------------------------------

_keys = itertools.count()


def fresh_key() -> str:
    return f"bench-{time.time_ns()}-{next(_keys)}"


async def call(app: Any, key: str | None) -> tuple[int, bool]:
    """POST /payments with ``key``; (status, whether the answer says it is a replay)."""
    # A named caller (its bearer token, headway's default scope): an unnamed one is never
    # replayed. The peers ignore the header.
    headers = [
        (b"host", b"bench"),
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer bench-caller"),
    ]
    if key is not None:
        headers.append((b"idempotency-key", f'"{key}"'.encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": "/payments", "raw_path": b"/payments",
        "root_path": "", "query_string": b"", "headers": headers,
        "client": ("127.0.0.1", 50000), "server": ("bench", 80),
    }  # fmt: skip
    sent = False
    status, replayed = 0, False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # the client never disconnects
        sent = True
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, replayed
        if message["type"] == "http.response.start":
            status = message["status"]
            replayed = any(k.lower() == b"idempotent-replayed" for k, _ in message["headers"])

    await app(scope, receive, send)
    return status, replayed


# -- round-trip counting ---------------------------------------------------------------------


class Counts:
    sent: ClassVar[list[Statements]] = []  # statements and transactions, per engine
    redis_writes = 0  # requests written to Redis (a pipeline is one)

    @classmethod
    def sql(cls) -> tuple[int, int]:
        """Statements sent, and transactions (each a BEGIN and a COMMIT/ROLLBACK round trip
        on asyncpg)."""
        return sum(len(s.sent) for s in cls.sent), sum(s.transactions for s in cls.sent)


class CountingConnection(aioredis.Connection):
    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        Counts.redis_writes += 1
        await super().send_packed_command(*args, **kwargs)


def count_wire_requests() -> None:
    """Count the requests headway writes on its own connection too (redis-py never sees them)."""
    send = PipelinedConnection.send

    def counted(self: Any, call: Any) -> None:
        Counts.redis_writes += 1
        send(self, call)

    PipelinedConnection.send = counted  # type: ignore[method-assign]


def count_sql(engine: AsyncEngine) -> None:
    """Count statements through SQLAlchemy and on the asyncpg driver (the store's executor
    runs its statements there, unseen by SQLAlchemy's events), and SQLAlchemy's transactions
    (an autocommitting connection sends neither BEGIN nor COMMIT: counted alone)."""
    Counts.sent.append(Statements(engine))


def server_commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


@dataclass
class PerRequest:
    sql: float
    transactions: float
    pg_round_trips: float
    redis_writes: float
    redis_commands: float


@contextmanager
def counted(info: redis.Redis, n: int, into: list[PerRequest]) -> Iterator[None]:
    before = (*Counts.sql(), Counts.redis_writes, server_commands(info))
    yield
    after = (*Counts.sql(), Counts.redis_writes, server_commands(info))
    sql, tx, writes, cmds = (a - b for a, b in zip(after, before, strict=True))
    cmds -= 1  # the first INFO counts itself
    into.append(PerRequest(sql / n, tx / n, (sql + 2 * tx) / n, writes / n, cmds / n))


# -- phases ----------------------------------------------------------------------------------


async def timed(into: Samples, n: int, op: Any) -> None:
    for _ in range(n):
        start = time.perf_counter()
        await op()
        into.latencies.append(time.perf_counter() - start)


async def latency_round(
    apps: dict[str, Any],
    engine: AsyncEngine,
    store: RecordStore,
    config: Config,
    info: redis.Redis,
    out: Results,
) -> None:
    bare, headway = apps["bare"], apps["headway"]
    replay_key = fresh_key()
    assert await call(headway, replay_key) == (201, False)
    scope_, key_ = await _first_row(engine, replay_key)
    pk = sa.select(records).where(records.c.scope == scope_, records.c.key == key_)

    async def pk_select() -> None:
        async with engine.connect() as conn:
            assert (await conn.execute(pk)).first() is not None

    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    async def pk_select_autocommit() -> None:
        async with autocommit.connect() as conn:
            assert (await conn.execute(pk)).first() is not None

    async def store_get() -> None:
        assert await store.get(scope_, key_) is not None

    async def bare_call() -> None:
        assert await call(bare, fresh_key()) == (201, False)

    async def replay() -> None:
        assert await call(headway, replay_key) == (201, True)

    async def first() -> None:
        assert await call(headway, fresh_key()) == (201, False)

    rows = {
        "PK SELECT (engine.connect)": pk_select,
        # Not the baseline: the same SELECT without BEGIN/COMMIT, the round trips a replay makes.
        "PK SELECT (autocommit)": pk_select_autocommit,
        "RecordStore.get": store_get,
        "bare endpoint": bare_call,
        "headway replay": replay,
        "headway first execution": first,
    }
    for name, op in rows.items():
        for _ in range(config.warmup):
            await op()
        with counted(info, config.sequential, out.counts.setdefault(name, [])):
            await timed(out.latency.setdefault(name, Samples()), config.sequential, op)


async def _first_row(engine: AsyncEngine, key: str) -> tuple[str, str]:
    async with engine.connect() as conn:
        row = (await conn.execute(sa.select(records).where(records.c.key == key))).one()
    return row.scope, row.key


async def throughput_round(apps: dict[str, Any], config: Config, out: Results) -> None:
    per_task = config.concurrent // config.tasks
    for subject, app in apps.items():
        # First executions: every request its own key.
        async def firsts(n: int = per_task, app: Any = app) -> None:
            for _ in range(n):
                status, _replayed = await call(app, fresh_key())
                assert status == 201, status

        # Warmed up as concurrently as measured: each subject's pools open their
        # connections before the clock starts (a pool that churns goes on churning).
        await asyncio.gather(*(firsts(config.warmup) for _ in range(config.tasks)))
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(firsts() for _ in range(config.tasks)))
        rate = per_task * config.tasks / (time.perf_counter() - start)
        out.throughput.setdefault((subject, "first"), Samples()).rates.append(rate)
        # This process's CPU (user + system) per first execution: with one event loop, the
        # rate cannot exceed 1 / this, whatever the database and Redis do.
        spent = (time.process_time() - cpu) / (per_task * config.tasks)
        out.cpu.setdefault(subject, Samples()).latencies.append(spent)

        # Replays: a few keys, each completed once beforehand, then requested over and over.
        keys = [fresh_key() for _ in range(config.replay_keys)]
        for key in keys:
            assert (await call(app, key))[0] == 201
        replayed = 0

        async def replays(offset: int, app: Any = app, keys: list[str] = keys) -> None:
            nonlocal replayed
            for i in range(per_task):
                status, is_replay = await call(app, keys[(offset + i) % len(keys)])
                assert status == 201, status
                replayed += is_replay

        start = time.perf_counter()
        await asyncio.gather(*(replays(t) for t in range(config.tasks)))
        rate = per_task * config.tasks / (time.perf_counter() - start)
        out.throughput.setdefault((subject, "replay"), Samples()).rates.append(rate)
        if subject != "bare":
            assert replayed == per_task * config.tasks, (subject, replayed)


@dataclass
class Results:
    latency: dict[str, Samples] = field(default_factory=dict)
    counts: dict[str, list[PerRequest]] = field(default_factory=dict)
    throughput: dict[tuple[str, str], Samples] = field(default_factory=dict)
    cpu: dict[str, Samples] = field(default_factory=dict)  # client CPU s per first execution


# -- report ----------------------------------------------------------------------------------


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}"


def report(out: Results, config: Config) -> str:
    lines = [f"rounds={config.rounds} sequential={config.sequential} "
             f"concurrent={config.concurrent} tasks={config.tasks}", ""]  # fmt: skip
    pk = out.latency["PK SELECT (engine.connect)"]
    bare = out.latency["bare endpoint"]
    lines += [
        "| row | p50 µs | p99 µs | p50 x PK SELECT | SQL stmts | transactions "
        "| PG round trips | Redis writes | Redis cmds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, samples in out.latency.items():
        c = out.counts[name]
        avg = PerRequest(
            *(statistics.mean(getattr(x, f) for x in c) for f in PerRequest.__dataclass_fields__)
        )
        lines.append(
            f"| {name} | {us(samples.p50())} | {us(samples.p99())} "
            f"| {samples.p50() / pk.p50():.2f} | {avg.sql:.2f} | {avg.transactions:.2f} "
            f"| {avg.pg_round_trips:.2f} | {avg.redis_writes:.2f} | {avg.redis_commands:.2f} |"
        )
    replay, first = out.latency["headway replay"], out.latency["headway first execution"]
    auto = out.latency["PK SELECT (autocommit)"]
    lines += [
        "",
        f"replay / PK SELECT: p50 {replay.p50() / pk.p50():.2f}x, "
        f"p99 {replay.p99() / pk.p99():.2f}x",
        f"replay / PK SELECT (autocommit): p50 {replay.p50() / auto.p50():.2f}x, "
        f"p99 {replay.p99() / auto.p99():.2f}x",
        f"first execution over bare: p50 +{us(first.p50() - bare.p50())} µs "
        f"({first.p50() / bare.p50():.1f}x), p99 +{us(first.p99() - bare.p99())} µs",
        "",
        "| subject | first executions req/s | client CPU µs per first execution "
        "| replays req/s | storage |",
        "| --- | --- | --- | --- | --- |",
    ]
    for subject, what in SUBJECTS.items():
        lines.append(
            f"| {subject} | {out.throughput[(subject, 'first')].rate():.0f} "
            f"| {us(out.cpu[subject].p50())} "
            f"| {out.throughput[(subject, 'replay')].rate():.0f} | {what} |"
        )
    peer = "asgi-idempotency-header"
    ours, theirs = out.throughput[("headway", "first")], out.throughput[(peer, "first")]
    paired = [a / b for a, b in zip(ours.rates, theirs.rates, strict=True)]
    lines += [
        "",
        f"headway / {peer} first executions: {ours.rate() / theirs.rate():.2f}x (medians); "
        f"per round {', '.join(f'{r:.2f}x' for r in paired)}",
    ]
    return "\n".join(lines)


# -- set-up ----------------------------------------------------------------------------------


async def run(redis_url: str, database_url: str, config: Config) -> str:
    store = RecordStore.from_url(database_url)  # as a user writes it: no pool tuning
    engine = create_async_engine(database_url)  # the baseline's, used one request at a time
    count_sql(engine)
    count_sql(store.engine)
    count_wire_requests()
    pool = aioredis.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    client = aioredis.Redis(connection_pool=pool)
    info = redis.Redis.from_url(redis_url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(records.create, checkfirst=True)
            await conn.execute(records.delete())
        apps = {name: build(store, client) for name, build in BUILDERS.items()}
        out = Results()
        for r in range(config.rounds):
            print(f"round {r + 1}/{config.rounds}", file=sys.stderr)
            await latency_round(apps, engine, store, config, info, out)
            order = dict(list(apps.items())[::-1] if r % 2 else apps)
            await throughput_round(order, config, out)
        return report(out, config)
    finally:
        await client.aclose()
        info.close()
        await store.aclose()
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--database-url", default=DATABASE_URL)
    args = parser.parse_args()
    config = QUICK if args.quick else FULL
    started = time.perf_counter()
    with private_redis() as url:
        print(asyncio.run(run(url, args.database_url, config)))
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
