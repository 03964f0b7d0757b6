"""The examples run as documented (on the embedded defaults and on Redis)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


def run(script: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_standalone_lock_in_memory() -> None:
    out = run("standalone_lock.py", HEADWAY_REDIS_URL="")
    assert "balance 500 after 50 deposits" in out


@pytest.mark.redis
def test_standalone_lock_on_redis(redis_url: str) -> None:
    out = run("standalone_lock.py", HEADWAY_REDIS_URL=redis_url)
    assert "balance 500 after 50 deposits" in out
