"""``headway lock`` and ``headway ratelimit``: look at a lock or a rate-limit key on a
server, without taking or charging anything (``cli`` registers them).

``headway lock NAME --url URL`` opens the lock backend the URL's scheme names
(``redis://``, ``postgresql://``, ``mysql://``, ``etcd://``, ``zookeeper://``) and
prints ``inspect``'s answer for the exclusive lock, the read-write lock or the
semaphore of NAME (``--mode``). ``headway ratelimit KEY --url redis://... --policy
100/minute`` peeks at the key's state under that policy, and ``--reset`` forgets it
(after a confirmation, unless ``--yes``): the only command here that writes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from headway._database import shown
from headway.lock.introspection import LockState
from headway.lock.modes import WRITE, permits
from headway.ratelimit.decision import Decision
from headway.ratelimit.policies import (
    FixedWindow,
    LeakyBucket,
    Policy,
    SlidingCounter,
    SlidingLog,
    TokenBucket,
)

__all__ = ["ALGORITHMS", "add_commands", "explain", "lock", "parse_policy", "ratelimit"]

#: ``--mode``: what of NAME to inspect.
MODES = {"exclusive": "the Lock", "rw": "the ReadWriteLock", "permits": "the Semaphore"}
#: ``--algorithm``: each policy class by its name.
ALGORITHMS: dict[str, Callable[[int, float], Policy]] = {
    "token_bucket": lambda n, seconds: TokenBucket(n, n, seconds),
    "leaky_bucket": lambda n, seconds: LeakyBucket(n, n, seconds),
    "fixed_window": FixedWindow,
    "sliding_log": SlidingLog,
    "sliding_counter": SlidingCounter,
}
_UNITS = {"s": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
_UNITS |= {"d": 86400, "day": 86400}
_POLICY = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+?)s?\s*")
#: The third-party module each server needs, and the extra that installs it.
_EXTRAS = {"asyncpg": "postgres", "aiomysql": "mysql", "httpx": "etcd", "kazoo": "zookeeper"}
_SCHEMES = "redis://, rediss://, unix://, postgresql://, mysql://, etcd://, zookeeper://"


def parse_policy(text: str, algorithm: str) -> Policy:
    """``100/minute``, ``10/30s``, ``5/1.5h``: a policy of ``algorithm`` (ValueError if bad).

    Args:
        text: The limit and its window.
        algorithm: A key of ``ALGORITHMS``.
    """
    found = _POLICY.fullmatch(text.lower())
    if found is None or found[3] not in _UNITS:
        raise ValueError(f"--policy {text!r}: write it as 100/minute, 10/30s or 5/1.5h")
    seconds = float(found[2] or 1) * _UNITS[found[3]]
    try:
        return ALGORITHMS[algorithm](int(found[1]), seconds)
    except ValueError as exc:  # out of the policy's range
        raise ValueError(f"--policy {text!r}: {exc}") from exc


def _scheme(url: str) -> str:
    scheme, colon, _ = url.partition("://")
    if not colon:
        raise ValueError(f"{shown(url)} is not a URL: use one of {_SCHEMES}")
    return scheme.lower().partition("+")[0]


def _sql_url(url: str, driver: str) -> Any:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"{shown(url)} is not a database URL: {exc}") from exc
    return parsed if "+" in parsed.drivername else parsed.set(drivername=driver)


Closer = Callable[[], Awaitable[object]]


def _redis(url: str, namespace: str | None, timeout: float) -> tuple[Any, list[Closer]]:
    from headway import RedisLockBackend

    backend = RedisLockBackend.from_url(url, timeout=timeout)
    return backend, [backend.aclose, backend.client.aclose]


def _sql(url: str, namespace: str | None, timeout: float) -> tuple[Any, list[Closer]]:
    from sqlalchemy.ext.asyncio import create_async_engine

    from headway.lock.backends.mysql import MySQLLockBackend
    from headway.lock.backends.postgres import PostgresLockBackend

    if _scheme(url).startswith("postgres"):
        postgres = _sql_url(url.replace("postgres://", "postgresql://", 1), "postgresql+asyncpg")
        engine = create_async_engine(postgres, connect_args={"timeout": timeout})
        return PostgresLockBackend(engine, timeout=timeout), [engine.dispose]
    mysql = _sql_url(url, "mysql+aiomysql")
    engine = create_async_engine(mysql, connect_args={"connect_timeout": timeout})
    return MySQLLockBackend(engine, timeout=timeout), [engine.dispose]


def _etcd(url: str, namespace: str | None, timeout: float) -> tuple[Any, list[Closer]]:
    from headway import EtcdLockBackend

    http = "https" if _scheme(url) == "etcds" else "http"
    hosts = [f"{http}://{host}" for host in url.partition("://")[2].rstrip("/").split(",")]
    backend = EtcdLockBackend(hosts, timeout=timeout, namespace=namespace or "headway/")
    return backend, [backend.aclose]


def _zookeeper(url: str, namespace: str | None, timeout: float) -> tuple[Any, list[Closer]]:
    from headway import ZooKeeperLockBackend

    # kazoo logs each refused connection: the one line this command prints says why.
    logging.getLogger("kazoo").addHandler(logging.NullHandler())
    logging.getLogger("kazoo").propagate = False
    hosts, prefix = url.partition("://")[2], namespace or "/headway/locks"
    backend = ZooKeeperLockBackend(hosts, timeout=timeout, prefix=prefix)
    return backend, [backend.aclose]


#: Each URL scheme's lock backend, made with the closers that end it.
_BACKENDS = {"redis": _redis, "rediss": _redis, "unix": _redis, "postgresql": _sql}
_BACKENDS |= {"postgres": _sql, "mysql": _sql, "mariadb": _sql, "etcd": _etcd}
_BACKENDS |= {"etcds": _etcd, "zookeeper": _zookeeper}


@contextlib.asynccontextmanager
async def lock_backend(url: str, namespace: str | None, timeout: float) -> AsyncIterator[Any]:
    """The async lock backend ``url``'s scheme names, closed on the way out.

    Args:
        url: The server's URL.
        namespace: etcd's key namespace, or ZooKeeper's path prefix; None: the default.
        timeout: Seconds each call may take.
    """
    scheme = _scheme(url)
    if scheme not in _BACKENDS:
        raise ValueError(f"unknown scheme {scheme!r} in {shown(url)}: use one of {_SCHEMES}")
    backend, closers = _BACKENDS[scheme](url, namespace, timeout)
    try:
        yield backend
    finally:
        for close in closers:
            await close()


async def _inspect_lock(args: argparse.Namespace) -> LockState:
    async with (
        asyncio.timeout(3 * args.timeout),
        lock_backend(args.url, args.namespace, args.timeout) as backend,
    ):
        if args.mode == "rw":
            backend = backend.for_mode(WRITE)  # the write view answers for readers too
        elif args.mode == "permits":
            backend = backend.for_mode(permits(1))  # any count: the state is the same
        state: LockState = await backend.inspect(args.name)
        return state


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3g} s"


def lock(args: argparse.Namespace) -> int:
    """Print who holds the lock NAME (fence, time left, owner, mode) and how many wait."""
    state = asyncio.run(_inspect_lock(args))
    if args.json:
        holders = [
            {"fence": h.fence, "expires_in": h.expires_in, "owner": h.owner, "mode": h.mode}
            for h in state.holders
        ]
        shape = {"resource": state.resource, "mode": args.mode, "holders": holders}
        print(json.dumps(shape | {"waiting": state.waiting}))
        return 0
    held = f"held by {len(state.holders)}" if state.held else "free"
    print(f"{MODES[args.mode]} {state.resource!r} on {shown(args.url)}: {held}, "
          f"{state.waiting} waiting")  # fmt: skip
    for h in state.holders:
        print(f"  fence {h.fence}  expires in {_seconds(h.expires_in)}  "
              f"owner {h.owner or '(none)'}  mode {h.mode}")  # fmt: skip
    return 0


async def _ratelimit(args: argparse.Namespace, policy: Policy, reset: bool) -> Decision:
    from headway.ratelimit.backends.redis import RedisRateLimitBackend
    from headway.ratelimit.limiter import RateLimiter

    if _scheme(args.url) not in ("redis", "rediss", "unix"):
        raise ValueError(f"rate limits live on Redis: {shown(args.url)} is not a redis:// URL")
    backend = RedisRateLimitBackend.from_url(args.url, timeout=args.timeout)
    try:
        async with asyncio.timeout(3 * args.timeout):
            await backend.client.ping()  # unreachable: the reason, not a failure-mode answer
            limiter = RateLimiter(policy, backend=backend, budget=args.timeout)
            if reset:
                await limiter.reset(args.key)
            return await limiter.peek(args.key)
    finally:
        await backend.aclose()
        await backend.client.aclose()


def _described(policy: Policy) -> str:
    return f"{policy.name}, {policy.limit} per {policy.window:g} s"


def _confirmed(args: argparse.Namespace, policy: Policy) -> bool:
    if args.yes:
        return True
    question = f"reset {args.key!r} ({_described(policy)}) on {shown(args.url)}? [y/N] "
    try:
        return input(question).strip().lower() in ("y", "yes")
    except EOFError:
        return False


def ratelimit(args: argparse.Namespace) -> int:
    """Print a rate-limit key's state under ``--policy`` without charging it; ``--reset``
    forgets it first (asks unless ``--yes``; 1 if not confirmed)."""
    policy = parse_policy(args.policy, args.algorithm)
    if args.reset and not _confirmed(args, policy):
        print("not reset", file=sys.stderr)
        return 1
    decision = asyncio.run(_ratelimit(args, policy, args.reset))
    left = decision.remaining  # a peek counts nothing spent
    if args.json:
        shape = {"key": args.key, "limit": decision.limit, "remaining": left}
        print(json.dumps(shape | {"reset_after": decision.reset_after, "reset": args.reset}))
        return 0
    done = "reset; " if args.reset else ""
    where = f"rate-limit key {args.key!r} on {shown(args.url)} ({_described(policy)})"
    print(f"{where}: {done}{left} of {decision.limit} left, "
          f"whole again in {_seconds(decision.reset_after)}")  # fmt: skip
    return 0


def explain(exc: BaseException, url: str, timeout: float) -> str:
    """One line on why the server at ``url`` could not be used.

    Args:
        exc: What was raised.
        url: The server's URL (its password is never shown).
        timeout: The seconds each call was given.
    """
    if isinstance(exc, ValueError):
        return str(exc).splitlines()[0]
    if isinstance(exc, ModuleNotFoundError) and exc.name in _EXTRAS:
        extra = _EXTRAS[exc.name]
        return f"{shown(url)} needs {exc.name}: pip install 'headway[{extra}]'"
    if isinstance(exc, TimeoutError) and not str(exc):
        reason = f"no answer within {timeout:g} s"
    else:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        reason = str(getattr(cause, "orig", None) or cause).splitlines()[0] or type(cause).__name__
    return f"cannot use {shown(url)}: {reason} (is it running, and is this its URL?)"


def add_commands(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add ``lock`` and ``ratelimit`` through ``cli``'s ``command`` helper.

    Args:
        command: Makes a subcommand's parser from its name and summary.
    """
    timeout = {"type": float, "default": 2.0, "help": "seconds per call (default 2)"}
    as_json = {"action": "store_true", "help": "print one JSON object"}
    found = command("lock", "show who holds a lock and how many wait (takes nothing)")
    found.add_argument("name", metavar="NAME", help="the lock's resource name")
    found.add_argument("--url", required=True, help=f"the lock server: {_SCHEMES}")
    found.add_argument(
        "--mode", choices=list(MODES), default="exclusive",
        help="the Lock (default), the ReadWriteLock or the Semaphore of NAME",
    )  # fmt: skip
    found.add_argument(
        "--namespace", help="etcd's key namespace (headway/) or ZooKeeper's prefix (/headway/locks)"
    )
    found.add_argument("--timeout", **timeout)  # type: ignore[arg-type]
    found.add_argument("--json", **as_json)  # type: ignore[arg-type]
    limit = command("ratelimit", "show a rate-limit key's state without charging it, or reset it")
    limit.add_argument("key", metavar="KEY", help="the key, as the app passes it to hit()")
    limit.add_argument("--url", required=True, help="the Redis server: redis://host:port/db")
    limit.add_argument(
        "--policy", required=True, help="the app's policy for the key: 100/minute, 10/30s"
    )
    limit.add_argument(
        "--algorithm", choices=list(ALGORITHMS), default="token_bucket",
        help="the policy's algorithm (default token_bucket)",
    )  # fmt: skip
    limit.add_argument("--reset", action="store_true", help="forget the key's usage first")
    limit.add_argument("--yes", action="store_true", help="reset without asking")
    limit.add_argument("--timeout", **timeout)  # type: ignore[arg-type]
    limit.add_argument("--json", **as_json)  # type: ignore[arg-type]
