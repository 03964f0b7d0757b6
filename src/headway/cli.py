"""The ``headway`` command: migrate, purge, show (``record``) and forget idempotency
records; play the demo; look at a lock or a rate-limit key (``lock``, ``ratelimit``:
``_inspect_cli``).

A database it cannot use (a sync URL, a driver not installed, a server it cannot reach, a
table never migrated) is one line on stderr saying what to do, and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from datetime import datetime

from alembic.util.exc import CommandError
from redis.exceptions import RedisError
from sqlalchemy import exc as sa_exc

from headway import __version__, _demo, _inspect_cli, _migrations
from headway._database import shown
from headway._errors import BackendUnavailable, DatabaseNotMigrated
from headway.idempotency.record import ForgetOutcome, RecordState

DESCRIPTION = (
    "headway's command: create and upgrade the idempotency records table (migrate), "
    "delete expired records (purge) or one record (forget), show one record (record), play "
    "the demo, and show who "
    "holds a lock (lock) or a rate-limit key's state (ratelimit)."
)
EPILOG = (
    "Exit status: 0 done; 1 forget removed no record, or record found none; 2 a usage "
    "error, or a server that "
    "could not be used (the reason on stderr, in one line); 1 also for a ratelimit --reset "
    "not confirmed."
)
URL_HELP = (
    "an async SQLAlchemy URL, e.g. postgresql+asyncpg://user@host/db or "
    "mysql+aiomysql://user@host/db (default: $HEADWAY_DATABASE_URL, else the embedded "
    f"SQLite file, {_migrations.DEFAULT_DATABASE_URL})"
)
#: --scope: the option's first name, still accepted (the table's column is still called so).
CALLER_OPTION = ("--caller", "--scope")
CALLER_HELP = "whose record: the caller's hashed id, the table's scope column (--scope: the same)"

#: What a command can fail with that the user can act on (anything else is a bug: traceback).
FAILURES = (
    BackendUnavailable,
    ValueError,
    ImportError,
    OSError,
    sa_exc.SQLAlchemyError,
    CommandError,
)


def _url(given: str | None) -> str:
    return given or os.environ.get("HEADWAY_DATABASE_URL") or _migrations.DEFAULT_DATABASE_URL


async def _purge(url: str, batch_size: int) -> int:
    from headway.idempotency.store import RecordStore

    store = RecordStore.from_url(url, create_table=False)
    try:
        return await store.purge(batch_size=batch_size)
    finally:
        await store.aclose()


async def _inspect(url: str, caller: str, key: str) -> RecordState | None:
    from headway.idempotency.store import RecordStore

    store = RecordStore.from_url(url, create_table=False)
    try:
        return await store.inspect(caller, key)
    finally:
        await store.aclose()


async def _forget(url: str, caller: str, key: str, force: bool) -> ForgetOutcome:
    from headway.idempotency.store import RecordStore

    store = RecordStore.from_url(url, create_table=False)
    try:
        return await store.forget(caller, key, force=force)
    finally:
        await store.aclose()


def migrate(args: argparse.Namespace, url: str) -> int:
    """Upgrade (or ``--downgrade``) the database and say from which revision to which."""
    step = _migrations.downgrade if args.downgrade else _migrations.upgrade
    done = step(url, args.revision or "head")
    at = f"{done.after or 'base'}{' (head)' if done.after == done.head else ''}"
    if done.before == done.after:
        print(f"{shown(url)} is already at {at}: nothing to do")
    else:
        verb = "downgraded" if args.downgrade else "migrated"
        print(f"{verb} {shown(url)} from {done.before or 'base'} to {at}")
    return 0


def purge(args: argparse.Namespace, url: str) -> int:
    """Delete expired records and say how many."""
    deleted = asyncio.run(_purge(url, args.batch_size))
    print(f"purged {deleted} expired idempotency record(s) from {shown(url)}")
    return 0


def forget(args: argparse.Namespace, url: str) -> int:
    """Delete one record; say whether it was removed, absent, or kept in flight."""
    outcome = asyncio.run(_forget(url, args.caller, args.key, args.force))
    key = repr(args.key)
    if outcome is ForgetOutcome.REMOVED:
        print(f"forgot the record of key {key}: its next request runs again")
        return 0
    if outcome is ForgetOutcome.IN_FLIGHT:
        print(f"kept the record of key {key}: a request holds it in flight (--force removes it)")
    else:
        print(f"no record for caller {args.caller!r} and key {key}: nothing to forget")
    return 1


#: How much of a fingerprint ``record`` prints: enough to tell two requests apart.
FINGERPRINT_SHOWN = 12


def _response(state: RecordState) -> str:
    if state.response_status is None:
        lease = state.lease_expires_at.isoformat() if state.lease_expires_at else "unknown"
        return f"none yet (its holder's lease lapses at {lease})"
    kept = "body not kept (over max_body)"
    size = kept if state.response_size is None else f"body {state.response_size} bytes"
    return f"status {state.response_status}, {size}"


def record(args: argparse.Namespace, url: str) -> int:
    """Show one record's status, times, fingerprint and response size (never its body)."""
    state = asyncio.run(_inspect(url, args.caller, args.key))
    key = repr(args.key)
    if state is None:
        print(f"no record for caller {args.caller!r} and key {key} in {shown(url)}")
        return 1
    prefix = state.fingerprint[:FINGERPRINT_SHOWN]
    if args.json:
        shape = dataclasses.asdict(state)
        del shape["fingerprint"]  # only its prefix, under a name that says so
        shape["fingerprint_prefix"] = prefix
        print(json.dumps(shape, default=datetime.isoformat))  # status: a str already
        return 0
    print(f"record of key {key} (caller {args.caller!r}) in {shown(url)}: {state.status.value}")
    print(f"  created      {state.created_at.isoformat()}")
    print(f"  expires      {state.expires_at.isoformat()}")
    print(f"  fingerprint  {prefix}...  fence {state.fence}")
    print(f"  response     {_response(state)}")
    return 0


def explain(exc: BaseException, url: str) -> str:
    """One line on what went wrong with the database at ``url``, and what to do."""
    if isinstance(exc, DatabaseNotMigrated | ValueError | ImportError | CommandError):
        return str(exc).splitlines()[0]  # these already say what to do
    cause = exc.__cause__ if isinstance(exc, BackendUnavailable) and exc.__cause__ else exc
    reason = str(getattr(cause, "orig", None) or cause).splitlines()[0]
    unreachable = (
        BackendUnavailable, OSError, sa_exc.OperationalError, sa_exc.InterfaceError,
    )  # fmt: skip
    if isinstance(exc, unreachable):
        return f"cannot reach the database at {shown(url)}: {reason} (is it running?)"
    return f"the database at {shown(url)} refused: {reason}"


def _look(args: argparse.Namespace) -> int:
    """Run ``lock`` or ``ratelimit``: a server it cannot use is one line, status 2."""
    try:
        if args.command == "lock":
            return _inspect_cli.lock(args)
        return _inspect_cli.ratelimit(args)
    except (*FAILURES, TimeoutError, ConnectionError, RedisError) as exc:
        print(f"headway: {_inspect_cli.explain(exc, args.url, args.timeout)}", file=sys.stderr)
        return 2


COMMANDS: dict[str, Callable[[argparse.Namespace, str], int]] = {
    "migrate": migrate,
    "purge": purge,
    "record": record,
    "forget": forget,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headway", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"headway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        described = f"{summary[0].upper()}{summary[1:]}."
        return commands.add_parser(name, help=summary, description=described, epilog=EPILOG)

    demo = command("demo", "play the demo scenes on the embedded defaults")
    demo.add_argument(
        "scenes", nargs="*", metavar="SCENE", help=f"scenes to play: {', '.join(_demo.SCENES)}"
    )
    _inspect_cli.add_commands(command)
    migrate = command("migrate", "create or upgrade headway's tables in a database")
    migrate.add_argument("url", nargs="?", metavar="URL", help=URL_HELP)
    migrate.add_argument(
        "--revision", help="target revision (default: head; required with --downgrade)"
    )
    migrate.add_argument(
        "--downgrade", action="store_true", help="revert down to --revision (base: all)"
    )
    purge = command("purge", "delete expired idempotency records")
    purge.add_argument("url", nargs="?", metavar="URL", help=URL_HELP)
    purge.add_argument("--batch-size", type=int, default=1000, help="rows per DELETE")
    shown_record = command(
        "record", "show one idempotency record: status, times, response size (never its body)"
    )
    shown_record.add_argument("key", metavar="KEY", help="the Idempotency-Key (without quotes)")
    shown_record.add_argument(*CALLER_OPTION, dest="caller", required=True, help=CALLER_HELP)
    shown_record.add_argument("url", nargs="?", metavar="URL", help=URL_HELP)
    shown_record.add_argument("--json", action="store_true", help="print one JSON object")
    forget = command("forget", "delete one idempotency record so its key runs again")
    forget.add_argument("key", metavar="KEY", help="the Idempotency-Key (without quotes)")
    forget.add_argument(*CALLER_OPTION, dest="caller", required=True, help=CALLER_HELP)
    forget.add_argument("url", nargs="?", metavar="URL", help=URL_HELP)
    forget.add_argument(
        "--force", action="store_true", help="remove it even while a request holds it in flight"
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's arguments, checked as ``main`` runs them; a usage error exits
    with status 2 (argparse's ``SystemExit``), having said why on stderr.

    Args:
        argv: The arguments after ``headway``; default None: ``sys.argv[1:]``.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        unknown = [name for name in args.scenes if name not in _demo.SCENES]
        if unknown:
            parser.error(f"unknown scene {unknown[0]!r}; choose from {', '.join(_demo.SCENES)}")
    if args.command == "migrate" and args.downgrade and args.revision is None:
        parser.error("migrate --downgrade needs --revision (e.g. --revision base removes all)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``headway`` console script."""
    args = parse_args(argv)
    if args.command == "demo":
        asyncio.run(_demo.run(args.scenes or list(_demo.SCENES)))
        return 0
    if args.command in ("lock", "ratelimit"):
        return _look(args)
    url = _url(args.url)
    # What the store logs (a missing table) is what this prints: said once, here.
    quiet = logging.getLogger("headway")
    if not any(isinstance(h, logging.NullHandler) for h in quiet.handlers):
        quiet.addHandler(logging.NullHandler())
    try:
        return COMMANDS[args.command](args, url)
    except FAILURES as exc:
        print(f"headway: {explain(exc, url)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
