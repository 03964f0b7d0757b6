"""Runs the ```python blocks of the docs: how they are found, what they may assume, how
they run. ``tests/test_snippets.py`` makes one test of each; docs/extending.md ("Code in
the docs") is the convention for writers, and this module is its reference.

A block runs as the body of an async function would (top-level ``await`` and
``async with`` allowed), in a fresh namespace, in a temporary directory (so the embedded
defaults' ``headway.sqlite3`` lands there), on asyncio; a block that awaits nothing runs
in a thread of its own, where a script's ``asyncio.run(main())`` works. An HTML comment on the line
before the fence may say more, space-separated:

- ``setup=NAME[,NAME...]``: the namespace starts with the names those setups provide
  (``SETUPS`` below). They stand for what is the reader's own: their app, their tables,
  their server's URL; a library name the block uses is imported by the block.
- ``continues``: the block runs after the previous ```python block of the same file, in
  its namespace (and that block's setups), as the next lines of one program; an indented
  block therefore continues the class the previous one defined.
- ``skip reason="..."``: not run, for a block that cannot run by nature. The reason is
  the skip's.

A block that talks to a server takes its URL from a setup (``redis_url``,
``database_url``), never a literal: while blocks run, any connection but to the test
services (``HEADWAY_TEST_*``) is refused, so none can reach a developer's Redis.
"""

from __future__ import annotations

import ast
import asyncio
import collections
import contextlib
import gc
import inspect
import re
import shlex
import socket
import types
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*snippet:(?P<body>.*?)-->\s*$")
PYTHON = {"python", "py", "python3"}


@dataclass
class Block:
    """One fenced ```python block: where it is, its code, and its comment's directives."""

    path: Path
    line: int  # of the opening fence, 1-based
    code: str  # the lines between the fences, the fence's own indentation removed
    setups: list[str] = field(default_factory=list)
    continues: bool = False
    skip: str | None = None
    previous: Block | None = None  # the block a ``continues`` block runs after

    @property
    def id(self) -> str:
        return f"{_relative(self.path)}:{self.line}"

    def chain(self) -> list[Block]:
        """The blocks this one runs with, first to last, itself included."""
        blocks = [self]
        while blocks[0].continues:
            previous = blocks[0].previous
            if previous is None:
                raise SnippetError(f"{self.id}: `continues`, but no ```python block precedes it")
            blocks.insert(0, previous)
        return blocks


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


class SnippetError(Exception):
    """A directive the harness cannot follow (a writer's mistake, reported as a failure)."""


def _directives(block: Block, body: str) -> None:
    words = shlex.split(body)
    for word in words:
        name, _, value = word.partition("=")
        if name == "setup" and value:
            unknown = [s for s in value.split(",") if s not in SETUPS]
            if unknown:
                raise SnippetError(f"{block.id}: unknown setup {unknown}; known: {sorted(SETUPS)}")
            block.setups += value.split(",")
        elif name == "continues" and not value:
            block.continues = True
        elif name == "skip":
            continue
        elif name == "reason" and value:
            block.skip = value
        else:
            raise SnippetError(f"{block.id}: unknown snippet directive {word!r}")
    if "skip" in words and not block.skip:
        raise SnippetError(f'{block.id}: a skip needs its reason: skip reason="..."')
    if block.skip is not None and "skip" not in words:
        raise SnippetError(f"{block.id}: reason= without skip")


def blocks(path: Path) -> list[Block]:
    """Every ```python block of a Markdown file, with its directives."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:  # the loop steps over whole blocks: a fence here opens one
            index += 1
            continue
        indent, lang = opening["indent"], opening["lang"]
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if lang in PYTHON:
            block = Block(path, index + 1, _dedent(lines[index + 1 : end], indent))
            before = index - 1
            while before >= 0 and not lines[before].strip():
                before -= 1
            directive = DIRECTIVE.match(lines[before]) if before >= 0 else None
            if directive:
                _directives(block, directive["body"])
            block.previous = next((b for b in reversed(found) if b.skip is None), None)
            found.append(block)
        index = end + 1
    _stray_directives(path, lines)
    return found


def _dedent(lines: list[str], indent: str) -> str:
    return "\n".join(line.removeprefix(indent) for line in lines)


def _stray_directives(path: Path, lines: list[str]) -> None:
    """A directive must sit right above a ```python fence, or it says nothing."""
    for number, line in enumerate(lines):
        if DIRECTIVE.match(line):
            after = number + 1
            while after < len(lines) and not lines[after].strip():
                after += 1
            fence = FENCE.match(lines[after]) if after < len(lines) else None
            if fence is None or fence["lang"] not in PYTHON:
                where = f"{_relative(path)}:{number + 1}"
                raise SnippetError(f"{where}: a snippet directive must precede a ```python fence")


def compile_chain(chain: list[Block]) -> types.CodeType:
    """One program of the chain's blocks, each at its own line of its Markdown file, so a
    traceback quotes the doc itself."""
    source: list[str] = []
    for block in chain:
        source += [""] * (block.line - len(source))  # the fence line is blank
        source += block.code.splitlines()
    code: types.CodeType = compile(
        "\n".join(source),
        str(chain[0].path),
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        dont_inherit=True,
    )
    return code


# -- setups: the reader's own things, for the blocks that name them -------------------


Setup = Callable[[pytest.FixtureRequest], contextlib.AbstractAsyncContextManager[dict[str, Any]]]
SETUPS: dict[str, Setup] = {}


def setup(function: Callable[[pytest.FixtureRequest], AsyncIterator[dict[str, Any]]]) -> Setup:
    made = contextlib.asynccontextmanager(function)
    SETUPS[function.__name__.removeprefix("setup_")] = made
    return made


@setup
async def setup_redis(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    """``redis_url``: the test Redis (``HEADWAY_TEST_REDIS_URL``), flushed."""
    from redis.asyncio import Redis

    url = request.getfixturevalue("redis_url")
    client = Redis.from_url(url)
    await client.flushdb()
    await client.aclose()
    yield {"redis_url": url}


@setup
async def setup_postgres(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    """``database_url``: the test PostgreSQL (``HEADWAY_TEST_DATABASE_URL``), its
    idempotency table migrated and empty (what ``headway migrate`` does)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from headway.idempotency.table import metadata, records

    url = request.getfixturevalue("postgres_url")
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(records.delete())
    await engine.dispose()
    yield {"database_url": url}


TABLES = """
DROP TABLE IF EXISTS accounts, reports;
CREATE TABLE accounts (id integer PRIMARY KEY, balance integer NOT NULL, fence bigint);
INSERT INTO accounts VALUES (42, 100, NULL);
CREATE TABLE reports (id integer PRIMARY KEY, body text NOT NULL, fence bigint);
INSERT INTO reports VALUES (7, 'draft', NULL)
"""


@setup
async def setup_tables(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    """Two fenced tables in the test PostgreSQL, dropped afterwards: ``accounts`` (``id``,
    ``balance``, ``fence``; row 42) and ``reports`` (``id``, ``body``, ``fence``; row 7),
    their SQLAlchemy ``Table``s, ``engine`` (an ``AsyncEngine`` on them) and
    ``database_url``."""
    from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, Text, text
    from sqlalchemy.ext.asyncio import create_async_engine

    url = request.getfixturevalue("postgres_url")
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        for statement in TABLES.split(";"):
            await conn.execute(text(statement))
    tables = MetaData()
    accounts = Table(
        "accounts",
        tables,
        Column("id", Integer, primary_key=True),
        Column("balance", Integer),
        Column("fence", BigInteger),
    )
    reports = Table(
        "reports",
        tables,
        Column("id", Integer, primary_key=True),
        Column("body", Text),
        Column("fence", BigInteger),
    )
    try:
        yield {"database_url": url, "engine": engine, "accounts": accounts, "reports": reports}
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("DROP TABLE accounts, reports"))
        await engine.dispose()


class Warehouse:
    """The reader's warehouse client: ``await warehouse.ship(order)`` has an ``id``."""

    def __init__(self) -> None:
        self.shipped: list[Any] = []

    async def ship(self, order: Any) -> types.SimpleNamespace:
        self.shipped.append(order)
        return types.SimpleNamespace(id=f"shp_{len(self.shipped)}")


@setup
async def setup_app(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    """The reader's application: ``app`` (a FastAPI app), ``routes`` (Starlette routes),
    ``rules`` (a list of ``Rule``), ``warehouse``, and async functions of a lease's fence:
    ``do_work``, ``load``, ``rebuild``, ``run_export``."""
    from fastapi import FastAPI
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from headway import Rule, TokenBucket

    async def endpoint(request: Any) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def work(fence: int) -> list[int]:
        assert isinstance(fence, int), fence
        await asyncio.sleep(0)
        return [fence]

    yield {
        "app": FastAPI(),
        "routes": [Route("/orders", endpoint, methods=["GET", "POST"])],
        "rules": [Rule(TokenBucket(10, 5))],
        "warehouse": Warehouse(),
        "do_work": work,
        "load": work,
        "rebuild": work,
        "run_export": work,
    }


@setup
async def setup_memory(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    """The reader's rate-limit backends, embedded: ``backend`` (``MemoryRateLimitBackend``)
    and ``sync_backend`` (``SyncMemoryRateLimitBackend``)."""
    from headway import MemoryRateLimitBackend, SyncMemoryRateLimitBackend

    yield {"backend": MemoryRateLimitBackend(), "sync_backend": SyncMemoryRateLimitBackend()}


@setup
async def setup_memory_lock(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    """The reader's lock backend, embedded: ``backend`` (``MemoryLockBackend``)."""
    from headway import MemoryLockBackend

    yield {"backend": MemoryLockBackend()}


# -- running --------------------------------------------------------------------------


def _service_addresses() -> set[tuple[str, int]]:
    from tests import conftest

    urls = [conftest.REDIS_URL, conftest.POSTGRES_URL, conftest.MYSQL_URL, conftest.ETCD_URL]
    urls += [f"zk://{host}" for host in conftest.ZOOKEEPER_HOSTS.split("/")[0].split(",")]
    found = set()
    for url in urls:
        parts = urlsplit(url)
        if parts.port is not None:
            for info in socket.getaddrinfo(parts.hostname, parts.port, type=socket.SOCK_STREAM):
                found.add((str(info[4][0]), parts.port))
    return found


@contextlib.contextmanager
def only_test_services(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Refuse every TCP connection but to the test services' addresses."""
    allowed = _service_addresses()
    connect = socket.socket.connect

    def guarded(sock: socket.socket, address: Any) -> None:
        inet = sock.family in (socket.AF_INET, socket.AF_INET6)
        if inet and (str(address[0]), int(address[1])) not in allowed:
            raise ConnectionRefusedError(
                f"a snippet connected to {address[0]}:{address[1]}, which is not a "
                "test service: take the URL from a setup (redis_url, database_url)"
            )
        connect(sock, address)

    with monkeypatch.context() as patch:
        patch.setattr(socket.socket, "connect", guarded)
        yield


#: Not searched: classes, modules, and functions (their globals are whole modules).
SKIPPED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)


def _opened(roots: list[Any]) -> list[Any]:
    """What the blocks opened and can still reach: headway's objects that close (the
    outermost ones: a backend closes its own parts), then redis-py clients and SQLAlchemy
    engines, wherever they are held (a ``Lock``'s backend's client, a middleware's)."""
    from redis.asyncio import Redis, RedisCluster
    from sqlalchemy.ext.asyncio import AsyncEngine

    closers: list[Any] = []
    clients: list[Any] = []
    seen: set[int] = set()
    queue: collections.deque[tuple[Any, bool]] = collections.deque((r, False) for r in roots)
    while queue and len(seen) < 100_000:
        value, inside = queue.popleft()
        if id(value) in seen or isinstance(value, SKIPPED):
            continue
        seen.add(id(value))
        if isinstance(value, Redis | RedisCluster | AsyncEngine):
            clients.append(value)
            continue
        mine = type(value).__module__.startswith("headway")
        closes = mine and inspect.iscoroutinefunction(getattr(type(value), "aclose", None))
        if closes and not inside:
            closers.append(value)
        queue.extend((referent, inside or closes) for referent in gc.get_referents(value))
    return closers + clients


async def _close(namespace: dict[str, Any], provided: dict[str, Any]) -> None:
    """Close what the blocks opened, so no connection is left for the garbage collector."""
    from sqlalchemy.ext.asyncio import AsyncEngine

    keep = {id(value) for value in provided.values()}
    for value in _opened(list(namespace.values())):
        if id(value) in keep:
            continue
        if isinstance(value, AsyncEngine):
            await value.dispose()
        else:
            await value.aclose()


def _default_registry_collectors() -> set[Any]:
    from prometheus_client import REGISTRY

    return set(REGISTRY._collector_to_names)


async def run(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Run ``block`` after the blocks it continues, with their setups, and clean up."""
    if block.skip is not None:
        pytest.skip(block.skip)
    chain = block.chain()
    code = compile_chain(chain)
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.chdir(tmp_path)
    from prometheus_client import REGISTRY

    collectors = _default_registry_collectors()
    async with contextlib.AsyncExitStack() as stack:
        provided: dict[str, Any] = {}
        for name in dict.fromkeys(s for b in chain for s in b.setups):
            provided.update(await stack.enter_async_context(SETUPS[name](request)))
        namespace: dict[str, Any] = {"__name__": "snippet", **provided}
        try:
            with only_test_services(monkeypatch):
                if code.co_flags & inspect.CO_COROUTINE:
                    await eval(code, namespace)  # the docs' own code, on purpose
                else:  # in a thread, where a script's asyncio.run(main()) can run
                    await asyncio.to_thread(eval, code, namespace)
        finally:
            await _close(namespace, provided)
            for collector in _default_registry_collectors() - collectors:
                REGISTRY.unregister(collector)
