"""The HTTP examples never answer 500, whatever a client sends (issue 25, item 7).

A seeded generator builds ~3,000 hostile requests per app, varying what an attacker
controls: the method, the request target (long, ``..``, ``%00``, percent-encoded UTF-8
and invalid UTF-8, query strings), the Idempotency-Key header (missing, empty, quoted or
bare, too long, non-ASCII bytes, repeated, with parameters or escapes, other Structured
Field types), the Content-Type, the body (invalid JSON, not UTF-8, 1k-100k levels of
nesting, huge and non-finite numbers, wrong types, duplicate members, bodies over the
middleware's limit, sent whole or in chunks), credentials (Authorization, X-API-Key,
Cookie), Host, forwarding and negotiation headers, and the peer address. Some requests
are retries of a recent one (the same, another body, the key in another case or with a
trailing space), and a few go twice at once. The apps run in process behind
``httpx.ASGITransport``; an app exception counts as a 500, as a server would answer it.

``examples/standalone_lock.py`` and ``examples/webhook_consumer.py`` have no HTTP face:
their only inputs are ``HEADWAY_REDIS_URL`` and ``HEADWAY_DATABASE_URL``, set by their
operator (a malformed one stops them with the driver's error).

httpx normalises a URL (it removes ``..`` segments, quotes bytes), so each request's
scope is filled in from the generated request the way an HTTP/1.1 server (h11 and
uvicorn) builds it from the bytes on the wire: the raw target is ASCII, ``path`` is its
percent-decoding, header names are lower-case, values any bytes but CR, LF and NUL.
"""

from __future__ import annotations

import asyncio
import random
import runpy
import time
import traceback
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from headway._http import ASGIApp, Receive, Scope, Send
from headway.idempotency.table import records
from tests.fuzz_requests import Fuzzed, Generator, common_paths
from tests.test_examples import EXAMPLES, create_table

pytestmark = pytest.mark.anyio

SEED = 20_250_725
REQUESTS = 3000  # per app on the embedded defaults
REQUESTS_ON_SERVERS = 600  # per app on PostgreSQL or MariaDB, and Redis


class Harness:
    """Runs ``app`` on each generated request's scope, as an HTTP/1.1 server would build it.

    The httpx request carries only the body and the serial number of the ``Fuzzed``
    whose method, target, headers and peer make the scope.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.pending: dict[bytes, Fuzzed] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fuzzed = self.pending[dict(scope["headers"])[b"x-fuzz-serial"]]
        raw_path, _, query = fuzzed.target.encode("ascii").partition(b"?")
        framing = (
            (b"transfer-encoding", b"chunked")
            if fuzzed.chunked
            else (b"content-length", str(len(fuzzed.body)).encode())
        )
        scope = {
            **scope,
            "method": fuzzed.method,
            "path": urllib.parse.unquote(raw_path.decode("ascii")),
            "raw_path": raw_path,
            "query_string": query,
            "headers": [*fuzzed.headers, framing],
            "client": fuzzed.client,
            "server": ("test", 80),
        }
        await self.app(scope, receive, send)


@dataclass
class Outcome:
    """The statuses answered, by input class, and every answer >= 500 described."""

    statuses: Counter[int] = field(default_factory=Counter)
    replays: int = 0  # answers marked Idempotent-Replayed
    sent: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[list[str], str, str]] = field(default_factory=list)

    def record(self, fuzzed: Fuzzed, status: int, error: str, replayed: bool = False) -> None:
        self.statuses[status] += 1
        self.replays += replayed
        self.sent.update(fuzzed.labels)
        if status >= 500:
            self.failures.append((fuzzed.labels, fuzzed.describe(), f"{status}: {error}"))

    def report(self) -> str:
        """Statuses, then what the answers >= 500 had in common and the first one."""
        lines = [
            "statuses: "
            + " ".join(f"{s}:{n}" for s, n in sorted(self.statuses.items()))
            + f" (replays: {self.replays})"
        ]
        if not self.failures:
            return lines[0]
        blamed = Counter(label for labels, _, _ in self.failures for label in labels)
        # The input classes most often behind a 5xx, for the share of them that failed.
        ranked = sorted(blamed, key=lambda lb: (-blamed[lb] / self.sent[lb], -blamed[lb]))
        lines.append(
            f"{len(self.failures)} answers >= 500; input classes by failure rate (failed/sent): "
            + ", ".join(f"{lb} {blamed[lb]}/{self.sent[lb]}" for lb in ranked[:6])
        )
        errors = Counter(error.strip().splitlines()[-1][:200] for _, _, error in self.failures)
        lines += [f"  {n} x {error}" for error, n in errors.most_common(5)]
        labels, described, error = self.failures[0]
        lines += [f"first: {labels}", f"  {described}"]
        lines += ["  " + line for line in error.strip().splitlines()[-14:]]
        return "\n".join(lines)


async def fire(app: ASGIApp, requests: Iterator[Fuzzed], seed: int) -> tuple[Outcome, float]:
    """Send every request (a few twice at once); an app exception counts as a 500.

    ``raise_app_exceptions`` stays on so the traceback is kept; a 500 the app answers
    itself is counted from its status. The transport is called without a client: an
    answer is taken as it is, never followed (or parsed) as a redirect.
    """
    harness = Harness(app)
    outcome = Outcome()
    twice = random.Random(seed)
    transport = httpx.ASGITransport(app=harness, raise_app_exceptions=True)

    async def one(fuzzed: Fuzzed, copy: int) -> None:
        serial = f"{id(fuzzed)}-{copy}".encode()
        harness.pending[serial] = fuzzed
        content: bytes | AsyncIterator[bytes] = fuzzed.body
        if fuzzed.chunked:

            async def chunks() -> AsyncIterator[bytes]:
                for start in range(0, len(fuzzed.body), 4096):
                    yield fuzzed.body[start : start + 4096]

            content = chunks()
        try:
            request = httpx.Request(
                "POST", "http://test/", content=content, headers={b"x-fuzz-serial": serial}
            )
            response = await transport.handle_async_request(request)
            await response.aread()
        except Exception:  # the app raised: a server answers 500
            outcome.record(fuzzed, 500, traceback.format_exc())
        else:
            replayed = response.headers.get("idempotent-replayed") == "true"
            outcome.record(fuzzed, response.status_code, response.text[:500], replayed)
        finally:
            del harness.pending[serial]

    started = time.perf_counter()
    for fuzzed in requests:  # made one at a time: a few bodies weigh megabytes
        if twice.random() < 0.03:
            fuzzed.labels.append("twice-at-once")
            await asyncio.gather(one(fuzzed, 0), one(fuzzed, 1))
        else:
            await one(fuzzed, 0)
    return outcome, time.perf_counter() - started


def payments_requests(count: int, seed: int) -> Iterator[Fuzzed]:
    gen = Generator(seed)

    def route() -> tuple[str, str, str]:
        if gen.rng.random() < 0.75:
            return "path:main", "/payments", "POST"
        label, path = gen.rng.choice(common_paths(gen.rng, "/payments"))
        return label, path, "POST"

    return (gen.request(route) for _ in range(count))


class ReportsGenerator(Generator):
    """Requests to the FastAPI example: its tokens, ``/reports/{id}``, ``POST /exports``."""

    known_tokens = ("free-token", "pro-token", "enterprise-token")

    def members(self, value: bytes) -> bytes:
        fmt = self.rng.choice([b'"csv"', b'"json"', b'"xml"', b"5", b"null", b'"\\u0000"'])
        if self.rng.random() < 0.2:
            return b'{"report_id": 1, "format": ' + value + b"}"
        return b'{"report_id": ' + value + b', "format": ' + fmt + b"}"

    def route(self) -> tuple[str, str, str]:
        r = self.rng
        odd_ids = ["0", "-1", "1.5", "1e3", "abc", "%00", "%201", "9" * 4301, "9" * 30, "+1", ""]
        label, path, method = r.choices(
            [
                ("path:exports", "/exports", "POST"),
                ("path:reports", f"/reports/{r.randint(1, 10**6)}", "GET"),
                ("path:report-id", "/reports/" + r.choice(odd_ids), "GET"),
                ("path:health", "/health", "GET"),
                ("path:docs", r.choice(["/openapi.json", "/docs", "/redoc"]), "GET"),
                (*r.choice(common_paths(r, "/exports")), "POST"),
                (*r.choice(common_paths(r, "/reports/1")), "GET"),
            ],
            weights=[35, 20, 15, 4, 2, 12, 12],
        )[0]
        return label, path, method


def report_requests(count: int, seed: int) -> Iterator[Fuzzed]:
    gen = ReportsGenerator(seed)
    return (gen.request(gen.route) for _ in range(count))


def check(name: str, outcome: Outcome, seconds: float) -> None:
    """Fail, saying what was sent and answered, if any answer was >= 500."""
    print(f"{name}: {sum(outcome.statuses.values())} answers in {seconds:.1f} s")
    if outcome.failures:
        pytest.fail(f"{name} answered >= 500:\n{outcome.report()}", pytrace=False)
    print(outcome.report())


def payments_example(monkeypatch: pytest.MonkeyPatch, database_url: str, redis_url: str) -> Any:
    """``examples/payments.py`` configured from the environment, as it documents."""
    monkeypatch.setenv("HEADWAY_DATABASE_URL", database_url)
    monkeypatch.setenv("HEADWAY_REDIS_URL", redis_url)
    return runpy.run_path(str(EXAMPLES / "payments.py"))


async def test_payments_example_never_answers_500(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sqlite = f"sqlite+aiosqlite:///{tmp_path / 'h.sqlite3'}"
    example = payments_example(monkeypatch, sqlite, "")
    try:
        outcome, seconds = await fire(example["app"], payments_requests(REQUESTS, SEED), SEED)
    finally:
        await example["STORE"].aclose()
    check("payments (SQLite, in-memory lock and limits)", outcome, seconds)
    assert outcome.statuses[201] >= REQUESTS // 10  # enough of them reached the handler
    assert outcome.replays > 0  # and retries were answered from the store


@pytest.mark.redis
@pytest.mark.parametrize(
    "database",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ],
)
async def test_payments_example_never_answers_500_on_a_database_and_redis(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, database: str, redis_url: str
) -> None:
    url = request.getfixturevalue(f"{database}_url")
    await create_table(url)  # what `headway migrate` does in production
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.execute(sa.delete(records))  # the keys of the last run would replay
    await engine.dispose()
    example = payments_example(monkeypatch, url, redis_url)
    await example["REDIS"].flushdb()
    try:
        requests = payments_requests(REQUESTS_ON_SERVERS, SEED + 1)
        outcome, seconds = await fire(example["app"], requests, SEED + 1)
    finally:
        await example["STORE"].aclose()
        await example["REDIS"].aclose()
    check(f"payments ({database}, Redis)", outcome, seconds)
    assert outcome.statuses[201] >= REQUESTS_ON_SERVERS // 10
    assert outcome.replays > 0  # retries were answered from the database


@pytest.mark.parametrize("limits", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_fastapi_example_never_answers_500(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, limits: str
) -> None:
    monkeypatch.setenv(
        "HEADWAY_REDIS_URL", "" if limits == "memory" else request.getfixturevalue("redis_url")
    )
    example = runpy.run_path(str(EXAMPLES / "fastapi_app.py"))
    count = REQUESTS if limits == "memory" else REQUESTS_ON_SERVERS
    if example["REDIS"] is not None:
        await example["REDIS"].flushdb()
    try:
        outcome, seconds = await fire(example["app"], report_requests(count, SEED + 2), SEED + 2)
    finally:
        if example["REDIS"] is not None:
            await example["REDIS"].aclose()
    check(f"fastapi_app ({limits} limits)", outcome, seconds)
    assert outcome.statuses[200] + outcome.statuses[202] >= count // 10
