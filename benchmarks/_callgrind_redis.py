"""A throw-away redis-server under valgrind's callgrind: instructions the server runs.

The count is the server's whole work for what the client sent (reading and parsing
requests, the commands, scripts and their Lua, writing replies), deterministic where
timings on a shared machine are not. The server runs ~50x slower under callgrind.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests
from tests.servers import free_port


class CountedRedis:
    """A redis-server under callgrind, and the instructions it ran during a call."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, folder: str) -> None:
        self.process = process
        self.url = f"redis://127.0.0.1:{port}/0"
        self.folder = folder

    def _control(self, *args: str) -> None:
        command = ["callgrind_control", *args, str(self.process.pid)]
        subprocess.run(command, check=True, capture_output=True)

    def instructions(self, run: Callable[[], object]) -> int:
        """Instructions the server ran while ``run`` ran (counters zeroed, then dumped)."""
        for old in glob.glob(os.path.join(self.folder, "cg.out.*")):
            os.remove(old)
        self._control("-z")
        run()
        self._control("-d")
        (dump,) = glob.glob(os.path.join(self.folder, "cg.out.*"))
        with open(dump) as lines:
            for line in lines:
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        raise RuntimeError(f"no totals in {dump}")


@contextlib.contextmanager
def counted_redis() -> Iterator[CountedRedis]:
    """Start redis-server under callgrind on a free port; stop it (by PID) on exit."""
    binary, valgrind = shutil.which("redis-server"), shutil.which("valgrind")
    if binary is None or valgrind is None:
        raise SystemExit("--instructions needs redis-server and valgrind on PATH")
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        command = [
            valgrind, "--tool=callgrind", f"--callgrind-out-file={folder}/cg.out",
            binary, "--port", str(port), "--save", "", "--appendonly", "no",
        ]  # fmt: skip
        process = subprocess.Popen(
            command, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _wait_until_up(port)
            yield CountedRedis(process, port, folder)
        finally:
            process.terminate()
            process.wait(30)


def _wait_until_up(port: int, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    client = redis.Redis(port=port)
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        finally:
            client.close()
