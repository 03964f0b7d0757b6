import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from headway import RecordStore, _migrations
from headway.cli import main


def test_demo_lock_scene(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "lock"]) == 0
    out = capsys.readouterr().out
    fences = [int(f) for f in re.findall(r"worker-\d fence +(\d+)", out)]
    assert fences == list(range(1, 13))
    assert "final balance 12" in out
    assert re.search(r"slow +fence +13 +wakes up and writes late: +REJECTED", out)
    assert "row kept fence 14 and balance 13" in out


def test_unknown_scene_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "nope"])
    assert exit_.value.code == 2
    assert "unknown scene 'nope'" in capsys.readouterr().err


def test_console_script_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "headway.cli", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0
    assert done.stdout.startswith("headway ")


def test_demo_idempotency_scene(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "idempotency"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"retry \(same key\) +-> 201 .*Idempotent-Replayed: true", out)
    assert re.search(r"duplicate while in flight +-> 409 \S+/idempotency-key-in-use", out)
    assert re.search(r"same key, new body +-> 422 \S+/idempotency-key-reused", out)
    assert re.search(r"bob, the same key +-> 201 \{\"charge\": 3", out)
    assert re.search(r"no credentials, retry +-> 409 \S+/idempotency-key-unverified", out)
    assert "charged 4 times for 8 requests" in out


def test_demo_function_scene(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "function"]) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"m-1 redelivered +-> \{'invoice': 'm-1', 'emails_sent': 1\} +\[replayed\]", out
    )
    assert re.search(
        r"5 times at once +-> 1 distinct answer +\[claimed, completed(, replayed){4}\]", out
    )
    assert re.search(r"mail server down\) +-> ConnectionError.*\[claimed, released\]", out)
    assert re.search(r"m-3 redelivered +-> .*\[claimed, completed\]", out)
    assert "IdempotencyKeyReused  [key_reused]" in out
    assert "ResultNotSerializable (a value of type datetime.date is not JSON)" in out
    assert "emails sent: 3 for 10 deliveries of 3 messages" in out
    assert re.search(r"2nd thread while the 1st runs +-> IdempotencyInProgress", out)
    assert "report-2026-11-24.csv (ran 1 time)" in out


# -- the database commands -------------------------------------------------------------------


#: Each command that opens a database, with the arguments it needs.
DATABASE_COMMANDS = [
    ["migrate"], ["purge"], ["record", "--caller", "s", "k"], ["forget", "--scope", "s", "k"],
]  # fmt: skip


def sqlite_url(tmp_path: Path, name: str = "h.sqlite3") -> str:
    return f"sqlite+aiosqlite:///{tmp_path / name}"


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    """What a failed command wrote: nothing on stdout, one line on stderr."""
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("headway: ")
    assert "Traceback" not in err
    return err


def test_help_reads_as_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        [],
        ["demo"],
        ["migrate"],
        ["purge"],
        ["record"],
        ["forget"],
        ["lock"],
        ["ratelimit"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--help"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert "``" not in out, out  # no reStructuredText markup
        assert "Exit status: 0 done; 1 forget removed no record, or record found none; 2" in (
            " ".join(out.split())
        )


def test_migrate_says_what_it_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = sqlite_url(tmp_path)
    assert main(["migrate", url]) == 0
    assert capsys.readouterr().out == f"migrated {url} from base to 0002 (head)\n"
    assert main(["migrate", url]) == 0
    assert capsys.readouterr().out == f"{url} is already at 0002 (head): nothing to do\n"
    assert main(["migrate", url, "--downgrade", "--revision", "base"]) == 0
    assert capsys.readouterr().out == f"downgraded {url} from 0002 to base\n"


def test_downgrade_without_a_revision_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = sqlite_url(tmp_path)
    _migrations.upgrade(url)
    with pytest.raises(SystemExit) as exit_:
        main(["migrate", url, "--downgrade"])
    assert exit_.value.code == 2
    assert "--downgrade needs --revision" in capsys.readouterr().err
    assert _migrations.upgrade(url).before == "0002"  # nothing was reverted


@pytest.mark.postgres
def test_a_password_is_never_printed(postgres_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = make_url(postgres_url).set(password="s3cret-pw")  # the server trusts the user
    asyncio.run(_unmigrated(postgres_url))  # other tests may have left their tables
    assert main(["migrate", url.render_as_string(hide_password=False)]) == 0
    out = capsys.readouterr().out
    assert "s3cret-pw" not in out
    assert url.render_as_string(hide_password=True) in out


@pytest.mark.parametrize(
    "command", [["purge"], ["record", "--caller", "s", "k"], ["forget", "--scope", "s", "k"]]
)
def test_a_table_never_migrated_says_run_migrate(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = sqlite_url(tmp_path)
    assert main([*command, url]) == 2
    assert f"run `headway migrate {url}`" in one_line_error(capsys)


@pytest.mark.parametrize(
    ("url", "advice"),
    [
        ("sqlite:///x.db", "use sqlite+aiosqlite:///x.db"),
        ("postgresql://app:pw@db/app", "use postgresql+asyncpg://app:***@db/app"),
        ("mysql+pymysql://app@db/app", "use mysql+aiomysql://app@db/app"),
    ],
)
@pytest.mark.parametrize("command", DATABASE_COMMANDS)
def test_a_sync_url_names_the_async_one(
    command: list[str],
    url: str,
    advice: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # SQLAlchemy's sync default, absent
    assert main([*command, url]) == 2
    err = one_line_error(capsys)
    assert advice in err
    assert ":pw@" not in err


@pytest.mark.parametrize(
    ("url", "module", "extra"),
    [
        ("postgresql+asyncpg://app@db/app", "asyncpg", "headway[postgres]"),
        ("mysql+aiomysql://app@db/app", "aiomysql", "headway[mysql]"),
    ],
)
@pytest.mark.parametrize("command", DATABASE_COMMANDS)
def test_a_missing_driver_names_the_extra(
    command: list[str],
    url: str,
    module: str,
    extra: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    assert main([*command, url]) == 2
    assert f"needs the driver {module}, which is not installed: pip install '{extra}'" in (
        one_line_error(capsys)
    )


@pytest.mark.parametrize("command", DATABASE_COMMANDS)
def test_an_unreachable_server_is_one_line(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = "postgresql+asyncpg://app:pw@127.0.0.1:1/app"  # nothing listens on port 1
    assert main([*command, url]) == 2
    err = one_line_error(capsys)
    assert "cannot reach the database at postgresql+asyncpg://app:***@127.0.0.1:1/app" in err


def test_forget_says_what_it_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = sqlite_url(tmp_path)
    _migrations.upgrade(url)

    async def in_flight() -> None:
        store = RecordStore.from_url(url, create_table=False)
        try:
            await store.claim("s", "k", "f" * 64, fence=None, lease_token="t", lease_ttl=30)
        finally:
            await store.aclose()

    asyncio.run(in_flight())
    assert main(["forget", "--caller", "s", "k", url]) == 1
    assert "a request holds it in flight (--force removes it)" in capsys.readouterr().out
    assert main(["forget", "--scope", "s", "k", url, "--force"]) == 0  # its first name
    assert "forgot the record of key 'k': its next request runs again" in capsys.readouterr().out
    assert main(["forget", "--caller", "s", "k", url]) == 1
    assert "no record for caller 's' and key 'k'" in capsys.readouterr().out


def test_the_console_script_writes_one_line_for_a_table_never_migrated(tmp_path: Path) -> None:
    # In its own process, where nothing captures logging: the store's log line about the
    # missing table must not come out beside the command's own.
    url = sqlite_url(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "headway.cli", "purge", url], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        f"headway: the idempotency table headway_idempotency_records does not exist: "
        f"run `headway migrate {url}`"
    ]


async def _unmigrated(url: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            for table in ("headway_idempotency_records", "alembic_version"):
                await connection.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    finally:
        await engine.dispose()
