"""Writes ``docs/decisions/index.md`` from the part files: every entry by part, and every
file an entry explains (its ``*Explains:*`` line) with the entries that explain it.

    python3 -m uv run python tools/decisions_index.py          # rewrite the index
    python3 -m uv run python tools/decisions_index.py --check  # exit 1 if it is stale

``tests/test_docs.py`` runs the check, and checks that every entry names files that exist.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECISIONS = ROOT / "docs" / "decisions"
INDEX = DECISIONS / "index.md"
#: The part files, in the index's order, with their section titles.
PARTS = {
    "lock.md": "Locks",
    "ratelimit.md": "Rate limits",
    "idempotency.md": "Idempotency",
    "redis.md": "Redis plumbing",
    "packaging.md": "Packaging and layout",
    "docs-and-tests.md": "Docs and tests",
}
EXPLAINS = "*Explains:* "
SUPERSEDED = "*Superseded*"
PATH = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Entry:
    part: str
    title: str
    #: The files it explains, as written on its ``*Explains:*`` line (empty: no line).
    explains: tuple[str, ...]
    #: A one-line stub naming the entry that replaced it: it explains no file.
    superseded: bool

    @property
    def link(self) -> str:
        return f"[{self.title}]({self.part}#{anchor(self.title)})"


def anchor(heading: str) -> str:
    """GitHub's (and the site's) heading anchor: lower case, punctuation dropped."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def entries(part: str) -> list[Entry]:
    """The part's entries, in file order."""
    found = []
    for block in re.split(r"^## ", (DECISIONS / part).read_text(), flags=re.MULTILINE)[1:]:
        title, _, body = block.partition("\n")
        first = body.lstrip("\n").split("\n", 1)[0]
        explains = first.removeprefix(EXPLAINS) if first.startswith(EXPLAINS) else ""
        found.append(
            Entry(part, title.strip(), tuple(PATH.findall(explains)), first.startswith(SUPERSEDED))
        )
    return found


def summary(part: str) -> str:
    """What the part covers: its opening paragraph up to the boilerplate."""
    opening = (DECISIONS / part).read_text().split("\n\n", 2)[1]
    return opening.split(" Short answers", 1)[0]


def _order(path: str) -> tuple[int, str, str]:
    """By folder: the package's modules, its Lua and SQL, migrations, tests, benchmarks,
    the rest."""
    folder, _, name = path.rpartition("/")
    ranks = ("src/headway/lua/", "migrations/", "tests/", "benchmarks/")
    rank = next((i for i, prefix in enumerate(ranks, 1) if path.startswith(prefix)), 5)
    if path.startswith("src/headway/sql/"):
        rank = 1
    elif rank == 5 and path.startswith("src/"):
        rank = 0
    return (rank, folder, name)


def render() -> str:
    parts = {part: entries(part) for part in PARTS}
    by_file: dict[str, list[Entry]] = defaultdict(list)
    for found in parts.values():
        for entry in found:
            for path in entry.explains:
                by_file[path].append(entry)
    lines = [
        "# Decisions",
        "",
        'Short answers to "why is it like this?", filed by part, each file oldest first.',
        "Each entry opens with the files it explains; [by file](#by-file) lists them with",
        "the entries that explain each. A new decision goes at the bottom of its part's",
        "file, with its `*Explains:*` line; then `python3 -m uv run python",
        "tools/decisions_index.py` rewrites this page (`tests/test_docs.py` fails while it",
        "is stale, or while an entry names a file that does not exist). Entries the code",
        "outgrew are kept as one line saying what replaced them.",
        "",
        "## By part",
    ]
    for part, title in PARTS.items():
        lines += ["", f"### {title}", "", f"[{part}]({part}): {summary(part)}", ""]
        lines += [f"- {entry.link}" for entry in parts[part]]
    lines += [
        "",
        "## By file",
        "",
        "Every file a decision explains: the package's modules, its Lua and SQL, then",
        "tests, benchmarks and the build.",
    ]
    folder = None
    for path in sorted(by_file, key=_order):
        if path.rpartition("/")[0] != folder:
            folder = path.rpartition("/")[0]
            lines += ["", f"### `{folder}/`" if folder else "### The project's root", ""]
        lines.append(f"- `{path}`")
        lines += [f"    - {entry.link}" for entry in by_file[path]]
    return "\n".join(lines) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if INDEX.read_text() != text:
            print(f"{INDEX.relative_to(ROOT)} is stale: run tools/decisions_index.py")
            return 1
        return 0
    INDEX.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
