"""The docs name only what exists: files, ``headway.*`` names, and local links with their
anchors. ``docs/decisions/`` and ``CHANGELOG.md`` are histories: they may name what was
removed since, so only their links are checked."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

import pytest
from tools import decisions_index as decisions

ROOT = Path(__file__).resolve().parents[1]
TRACKED = subprocess.run(
    ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
).stdout.split()
GUIDES = ["README.md", "benchmarks/README.md"] + [
    f
    for f in TRACKED
    if f.startswith("docs/") and f.endswith(".md") and not f.startswith("docs/decisions/")
]
HISTORIES = [f for f in TRACKED if f.startswith("docs/decisions/")] + ["CHANGELOG.md"]
#: Files a walkthrough asks the reader to create (docs/extending.md's new algorithm,
#: docs/getting-started.md's first app).
EXAMPLES = {
    "src/headway/lua/ratelimit/gcra2.lua",
    "lua/ratelimit/leasing/gcra2.lua",
    "lua/ratelimit/settling/gcra2.lua",
    "app.py",
}

FILE = re.compile(r"`([A-Za-z0-9_./-]+\.(?:py|lua|sql|md|toml|cfg))`")
NAME = re.compile(r"`(headway(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _tracked(path: str) -> bool:
    return path in EXAMPLES or any(f == path or f.endswith("/" + path) for f in TRACKED)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("doc", GUIDES)
def test_files_and_names_a_guide_mentions_exist(doc: str) -> None:
    text = (ROOT / doc).read_text()
    missing = [p for p in FILE.findall(text) if not _tracked(p)]
    missing += [n for n in NAME.findall(text) if not n.endswith(".sqlite3") and not _resolves(n)]
    assert missing == [], f"{doc} names what does not exist: {missing}"


@pytest.mark.parametrize("doc", GUIDES + HISTORIES)
def test_local_links_and_their_anchors_exist(doc: str) -> None:
    broken = []
    for target in LINK.findall((ROOT / doc).read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        file = (ROOT / doc).parent / path if path else ROOT / doc
        if not file.exists() or (
            anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text())
        ):
            broken.append(target)
    assert broken == [], f"{doc} links to what does not exist: {broken}"


REFERENCE = re.compile(r"^::: headway\.(\w+)$", flags=re.MULTILINE)


def test_every_public_name_is_on_a_reference_page() -> None:
    import headway

    listed = [
        name
        for page in sorted((ROOT / "docs/reference").glob("*.md"))
        for name in REFERENCE.findall(page.read_text())
    ]
    assert sorted(set(headway.__all__) - set(listed)) == [], "public names on no reference page"
    assert sorted(set(listed) - set(headway.__all__)) == [], "reference entries not public"
    assert sorted(n for n in set(listed) if listed.count(n) > 1) == [], "listed twice"


#: The pages a user reads to learn headway: the README and the guides (not the reference,
#: which lists every name by construction, nor the decisions).
USER_GUIDES = ["README.md", *(f for f in TRACKED if re.fullmatch(r"docs/[\w-]+\.md", f))]


def test_every_public_name_is_in_a_guide() -> None:
    import headway

    text = "\n".join((ROOT / guide).read_text() for guide in USER_GUIDES)
    unmentioned = [n for n in headway.__all__ if not re.search(rf"\b{n}\b", text)]
    assert unmentioned == [], "public names only the reference shows: say in a guide what for"


#: The guides in a user's order (issue 31): getting started, locks, rate limits,
#: idempotency, metrics, extending, testing.
ORDER = [
    "getting-started.md", "locks.md", "ratelimit.md", "ratelimit-middleware.md",
    "idempotency.md", "idempotent-functions.md", "metrics.md", "extending.md", "testing.md",
]  # fmt: skip


def _guides_in(text: str) -> list[str]:
    """The guides ``text`` links or lists, in their first appearance's order."""
    found = re.findall(r"(?:docs/|\(| )([\w-]+\.md)\b", text)
    return list(dict.fromkeys(page for page in found if page in ORDER))


def test_the_guides_are_in_a_users_order() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    index = (ROOT / "docs/index.md").read_text().split("## Read in this order", 1)[1]
    readme = (ROOT / "README.md").read_text().split("**The guides**", 1)[1].split("\n\n")[0]
    for where, text in [("mkdocs.yml nav", nav), ("docs/index.md", index), ("README", readme)]:
        assert _guides_in(text) == ORDER, where


def test_every_page_is_in_the_site() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [f.removeprefix("docs/") for f in GUIDES + HISTORIES if f.startswith("docs/")]
    assert [p for p in pages if f" {p}\n" not in nav] == []


#: The README's opening: install + demo, install + tests. `.ci/run` runs the second.
OPENING = """```sh
python3 -m pip install uv && python3 -m uv run headway demo                # install, run the demo
python3 -m pip install uv && python3 -m uv run pytest -n 2 --dist loadfile # install, run the tests
```"""


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, "the README is a front door: guides go in docs/"
    before_first_section = readme.split("\n## ", 1)[0]
    assert before_first_section.find("```") == before_first_section.find(OPENING) >= 0, (
        "the README must open with the two commands"
    )


#: Every decision entry, by part (``docs/decisions/<part>``).
DECISIONS = [entry for part in decisions.PARTS for entry in decisions.entries(part)]
#: A file pointing at a part's decisions, perhaps at one entry: ``docs/decisions/lock.md``,
#: ``(docs/decisions/ratelimit.md, "Plain values on the hot path")``.
POINTER = re.compile(r"docs/decisions/([\w-]+\.md)`*(?:,\s*\"([^\"]+)\")?")


def test_every_decision_names_the_files_it_explains_and_they_exist() -> None:
    files = sorted(f.removeprefix("docs/decisions/") for f in HISTORIES if f != "CHANGELOG.md")
    assert files == sorted([*decisions.PARTS, "index.md"]), "a part missing from PARTS"
    problems = []
    for entry in DECISIONS:
        if entry.superseded:
            if entry.explains:
                problems.append(f"{entry.link}: superseded, yet explains {entry.explains}")
        elif not entry.explains:
            problems.append(f"{entry.link}: no `*Explains:*` line under its heading")
        problems += [
            f"{entry.link}: {path} does not exist (moved? renamed?)"
            for path in entry.explains
            if path not in TRACKED
        ]
    titles = [(entry.part, entry.title) for entry in DECISIONS]
    problems += [f"two entries titled {t}" for t in set(titles) if titles.count(t) > 1]
    assert problems == []


def test_the_decisions_index_is_current() -> None:
    assert (ROOT / "docs/decisions/index.md").read_text() == decisions.render(), (
        "docs/decisions/index.md is stale: python3 -m uv run python tools/decisions_index.py"
    )


def test_code_that_points_at_a_decision_is_explained_by_it() -> None:
    """A module that sends its reader to ``docs/decisions/<part>.md`` is on an
    ``*Explains:*`` line there (so the index lists it), and a title it quotes is one."""
    stale = []
    for path in (f for f in TRACKED if f.startswith("src/")):
        for part, title in POINTER.findall((ROOT / path).read_text()):
            if part == "index.md":  # the index lists every file: pointing there is enough
                continue
            found = [e for e in DECISIONS if e.part == part]
            if not any(path in e.explains for e in found):
                stale.append(f"{path} points at {part}, where no entry explains it")
            if title and not any(e.title.startswith(title) for e in found):
                stale.append(f"{path} quotes {title!r}, no entry of {part}")
    assert stale == []
