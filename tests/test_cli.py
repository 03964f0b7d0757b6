import re
import subprocess
import sys

import pytest

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
