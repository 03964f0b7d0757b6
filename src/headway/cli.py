"""The ``headway`` command."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Sequence

from headway import __version__, _demo, _migrations
from headway.idempotency.record import ForgetOutcome


def _url(given: str | None) -> str:
    return given or os.environ.get("HEADWAY_DATABASE_URL") or _migrations.DEFAULT_DATABASE_URL


async def _purge(url: str, batch_size: int) -> int:
    from headway.idempotency.store import RecordStore

    store = RecordStore.from_url(url, create_table=False)
    try:
        return await store.purge(batch_size=batch_size)
    finally:
        await store.aclose()


async def _forget(url: str, scope: str, key: str, force: bool) -> ForgetOutcome:
    from headway.idempotency.store import RecordStore

    store = RecordStore.from_url(url, create_table=False)
    try:
        return await store.forget(scope, key, force=force)
    finally:
        await store.aclose()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headway", description=__doc__)
    parser.add_argument("--version", action="version", version=f"headway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="play the demo scenes on the embedded defaults")
    demo.add_argument(
        "scenes", nargs="*", metavar="SCENE", help=f"scenes to play: {', '.join(_demo.SCENES)}"
    )
    url_help = (
        "SQLAlchemy async URL (default: $HEADWAY_DATABASE_URL, else the embedded SQLite file)"
    )
    migrate = commands.add_parser("migrate", help="apply headway's migrations to a database")
    migrate.add_argument("url", nargs="?", metavar="URL", help=url_help)
    migrate.add_argument("--revision", default="head", help="target revision (default: head)")
    migrate.add_argument(
        "--downgrade", action="store_true", help="revert down to --revision (e.g. base)"
    )
    purge = commands.add_parser("purge", help="delete expired idempotency records")
    purge.add_argument("url", nargs="?", metavar="URL", help=url_help)
    purge.add_argument("--batch-size", type=int, default=1000, help="rows per DELETE")
    forget = commands.add_parser(
        "forget", help="delete one idempotency record so its key runs again"
    )
    forget.add_argument("key", metavar="KEY", help="the Idempotency-Key (without quotes)")
    forget.add_argument(
        "--scope", required=True, help="the record's scope column (the caller's hashed identity)"
    )
    forget.add_argument("url", nargs="?", metavar="URL", help=url_help)
    forget.add_argument(
        "--force", action="store_true", help="remove it even while a request holds it in flight"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``headway`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "migrate":
        if args.downgrade:
            _migrations.downgrade(_url(args.url), args.revision)
        else:
            _migrations.upgrade(_url(args.url), args.revision)
    if args.command == "purge":
        deleted = asyncio.run(_purge(_url(args.url), args.batch_size))
        print(f"purged {deleted} expired idempotency record(s)")
    if args.command == "forget":
        if not asyncio.run(_forget(_url(args.url), args.scope, args.key, args.force)):
            print("no record removed: none for this scope and key, or one in flight (--force)")
            return 1
        print(f"forgot the record of key {args.key!r}: its next request runs again")
    if args.command == "demo":
        unknown = [name for name in args.scenes if name not in _demo.SCENES]
        if unknown:
            parser.error(f"unknown scene {unknown[0]!r}; choose from {', '.join(_demo.SCENES)}")
        asyncio.run(_demo.run(args.scenes or list(_demo.SCENES)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
