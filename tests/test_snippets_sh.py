"""Every ``headway`` command line in the ```sh blocks of README.md and the guides (docs/,
decisions excepted, as ``test_snippets.py``) is accepted by the command's own argument
parser (``headway.cli.parse_args``, what ``main`` runs), and those that need no server run.

A command line is ``headway ...``, or ``uv run headway ...`` / ``python3 -m uv run headway
...``, anywhere in a line split at ``&&``, ``||``, ``;`` and ``|``, ``#`` comments and
``\\`` continuations as a shell reads them. Parsing never connects: lines naming a server
(``postgresql+asyncpg://app@db/app``, ``redis://localhost``) are only parsed. Those that
need none are run, in a temporary directory, in the docs' order: ``headway demo`` and the
database commands on a SQLite URL (or on the default, the embedded SQLite file).

Out of scope: every other line of a ```sh block (``pip``, ``uv sync``, ``pytest``,
``docker``, ``uvicorn``, ``curl``, ``mkdocs``): they belong to other programs, whose own
options headway does not define.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from headway import cli
from tests.snippets import FENCE, ROOT
from tests.test_snippets import DOCS

SHELL = {"sh", "bash", "shell", "console"}
#: What may stand before ``headway`` on a line: how the docs run it.
RUNNERS = [(), ("uv", "run"), ("python3", "-m", "uv", "run")]
SEPARATORS = {"&&", "||", ";", "|", "&"}


@dataclass(frozen=True)
class Command:
    """One ``headway`` command line of the docs: where it is, its arguments."""

    where: str
    argv: tuple[str, ...]


def shell_lines(path: Path) -> list[tuple[int, str]]:
    """The lines of ``path``'s ```sh blocks, with their line numbers, continuations joined."""
    found: list[tuple[int, str]] = []
    inside, joined = False, ""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fence = FENCE.match(line)
        if fence is not None:
            inside = not inside and fence["lang"] in SHELL
            continue
        if not inside:
            continue
        joined = f"{joined} {line.rstrip().removesuffix(chr(92))}" if joined else line
        if not line.rstrip().endswith("\\"):
            found.append((number, joined))
            joined = ""
    return found


def headway_argvs(line: str) -> list[tuple[str, ...]]:
    """The arguments of each ``headway`` command in one shell line."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    argvs, words = [], []
    for token in [*lexer, ";"]:
        if token not in SEPARATORS:
            words.append(token)
            continue
        for runner in RUNNERS:
            cut = len(runner)
            if tuple(words[:cut]) == runner and words[cut : cut + 1] == ["headway"]:
                argvs.append(tuple(words[cut + 1 :]))
        words = []
    return argvs


def commands(path: Path) -> list[Command]:
    where = path.relative_to(ROOT).as_posix()
    return [
        Command(f"{where}:{number}", argv)
        for number, line in shell_lines(path)
        for argv in headway_argvs(line)
    ]


COMMANDS = [command for doc in DOCS for command in commands(doc)]


def test_the_docs_have_headway_commands() -> None:
    assert {c.argv[0] for c in COMMANDS} >= {"demo", "migrate", "purge", "forget", "record"}
    assert headway_argvs("python3 -m pip install uv && python3 -m uv run headway demo # x") == [
        ("demo",)
    ]
    assert headway_argvs("pip install 'headway[postgres]'  # not headway's") == []


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_a_documented_command_parses(command: Command) -> None:
    cli.parse_args(command.argv)


def test_a_misspelled_option_fails(capsys: pytest.CaptureFixture[str]) -> None:
    optioned = [c for c in COMMANDS if any(a.startswith("--") for a in c.argv)]
    assert optioned
    for command in optioned:
        option = next(a for a in command.argv if a.startswith("--"))
        misspelled = re.sub(r"^--(\w)(\w)", r"--\2\1", option)  # --scope: --cspoe
        argv = [misspelled if a == option else a for a in command.argv]
        with pytest.raises(SystemExit) as exit_:
            cli.parse_args(argv)
        assert exit_.value.code == 2, command
        assert capsys.readouterr().err.startswith("usage: headway")


def _needs_no_server(argv: tuple[str, ...]) -> bool:
    args = cli.parse_args(argv)
    if args.command == "demo":
        return True
    return args.command in cli.COMMANDS and cli._url(args.url).startswith("sqlite")


def test_the_commands_that_need_no_server_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HEADWAY_DATABASE_URL", raising=False)
    runnable = dict.fromkeys(c.argv for c in COMMANDS if _needs_no_server(c.argv))
    assert ("demo",) in runnable
    assert any(argv[0] == "migrate" for argv in runnable), "no database command runs"
    for argv in runnable:
        status = cli.main(list(argv))
        err = capsys.readouterr().err
        assert status in (0, 1), f"headway {shlex.join(argv)}: {status} {err}"  # 1: none found
