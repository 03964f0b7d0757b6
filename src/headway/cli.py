"""The ``headway`` command."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from . import __version__, _demo


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``headway`` console script."""
    parser = argparse.ArgumentParser(prog="headway", description=__doc__)
    parser.add_argument("--version", action="version", version=f"headway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="play the demo scenes on the embedded defaults")
    demo.add_argument(
        "scenes", nargs="*", metavar="SCENE", help=f"scenes to play: {', '.join(_demo.SCENES)}"
    )
    args = parser.parse_args(argv)
    if args.command == "demo":
        unknown = [name for name in args.scenes if name not in _demo.SCENES]
        if unknown:
            parser.error(f"unknown scene {unknown[0]!r}; choose from {', '.join(_demo.SCENES)}")
        asyncio.run(_demo.run(args.scenes or list(_demo.SCENES)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
