"""Every ```python block of README.md and of the Markdown under docs/ runs (docs/decisions/
excepted: it is a history), so the docs cannot drift from the code. One test per block,
its id the block's ``file:line``.

The convention (docs/extending.md, "Code in the docs"; ``tests/snippets.py`` is its
reference): a block runs as an async function's body would, so top-level ``await`` is
fine, in a fresh namespace. An HTML comment on the line before its fence may add:

- ``<!-- snippet: setup=redis,app -->``: names the setups provide (``SETUPS``), standing
  for the reader's own things: ``redis_url`` and ``database_url`` (the test servers),
  ``engine`` and its ``accounts`` and ``reports`` tables, ``app``, ``routes``, ``rules``,
  ``warehouse``, ``do_work``..., ``backend``. Library names are imported by the block.
- ``<!-- snippet: continues -->``: run after the previous ```python block of the file, in
  its namespace, as one program with it.
- ``<!-- snippet: skip reason="..." -->``: only for a block that cannot run by nature.

```sql``, ```text and unlabelled blocks are not run; in ```sh blocks, ``headway``
command lines are parsed, and run when they need no server, by ``test_snippets_sh.py``.
While a block runs, a connection to anything but the test services is refused: a block
never reaches the developer's own Redis on 6379.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.snippets import ROOT, Block, SnippetError, blocks, run

pytestmark = pytest.mark.anyio

GUIDES = (ROOT / "docs").rglob("*.md")
DOCS = [ROOT / "README.md", *sorted(p for p in GUIDES if "decisions" not in p.parts)]
BLOCKS = [block for doc in DOCS for block in blocks(doc)]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
async def test_snippet_runs(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    await run(block, request, tmp_path)


def test_the_docs_have_snippets_and_few_skips() -> None:
    assert len(BLOCKS) > 20
    skipped = [b.id for b in BLOCKS if b.skip is not None]
    assert len(skipped) <= len(BLOCKS) // 10, f"so many skipped blocks: {skipped}"


# -- the harness itself ---------------------------------------------------------------


def _doc(tmp_path: Path, text: str) -> list[Block]:
    path = tmp_path / "doc.md"
    path.write_text(text)
    return blocks(path)


BROKEN = """\
# A doc

```python
from headway import TokenBucket

bucket = TokenBucket(10, 5)
```

<!-- snippet: continues -->

```python
assert bucket.capacity == 11, "the doc says 11"
```

```sh
this is not run
```

```python
await asyncio.sleep(0)  # asyncio was never imported
```
"""


async def test_a_broken_snippet_fails(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    first, wrong, unimported = _doc(tmp_path, BROKEN)
    assert (first.line, wrong.line, unimported.line) == (3, 11, 19)
    assert wrong.chain() == [first, wrong]
    await run(first, request, tmp_path)
    with pytest.raises(AssertionError, match="the doc says 11") as failed:
        await run(wrong, request, tmp_path)
    assert failed.traceback[-1].lineno + 1 == 12  # the doc's own line, 0-based here
    with pytest.raises(NameError, match="asyncio"):
        await run(unimported, request, tmp_path)


async def test_a_snippet_cannot_reach_a_server_it_was_not_given(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    (block,) = _doc(
        tmp_path,
        '```python\nimport asyncio\n\nawait asyncio.open_connection("127.0.0.1", 1)\n```\n',
    )
    with pytest.raises(Exception, match="not a test service"):
        await run(block, request, tmp_path)


@pytest.mark.parametrize(
    ("directive", "error"),
    [
        ("setup=nowhere", "unknown setup"),
        ("skip", "needs its reason"),
        ('reason="x"', "reason= without skip"),
        ("contiues", "unknown snippet directive"),
    ],
)
def test_a_directive_must_make_sense(tmp_path: Path, directive: str, error: str) -> None:
    with pytest.raises(SnippetError, match=error):
        _doc(tmp_path, f"<!-- snippet: {directive} -->\n```python\npass\n```\n")


def test_a_directive_must_precede_a_python_block(tmp_path: Path) -> None:
    with pytest.raises(SnippetError, match="must precede"):
        _doc(tmp_path, "<!-- snippet: continues -->\n\n```sh\nls\n```\n")


async def test_a_skipped_snippet_says_why(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    (block,) = _doc(
        tmp_path, '<!-- snippet: skip reason="a transcript" -->\n```python\n>>> 1\n```\n'
    )
    with pytest.raises(pytest.skip.Exception, match="a transcript"):
        await run(block, request, tmp_path)


async def test_a_script_runs_its_own_event_loop(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    (block,) = _doc(
        tmp_path,
        "```python\nimport asyncio\n\n\nasync def main() -> int:\n    return 7\n\n\n"
        "assert asyncio.run(main()) == 7\n```\n",
    )
    await run(block, request, tmp_path)
