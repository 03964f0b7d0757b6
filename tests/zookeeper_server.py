"""A throw-away ZooKeeper server (Debian's ``zookeeper.jar`` on a JRE) for tests and benchmarks.

It listens on a free loopback port with a short ``tickTime``, so sessions can be as
short as two ticks: a test can let a session expire in about a second. It answers the
``srvr`` and ``wchc`` (the watches of each session) four-letter commands. It is stopped
by its PID.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.servers import free_port

JAR = Path("/usr/share/java/zookeeper.jar")
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


def available() -> str | None:
    """Why no server can be started here, or None if one can."""
    if shutil.which("java") is None:
        return "no java on PATH (install a JRE and zookeeperd)"
    if not JAR.exists():
        return f"{JAR} is missing (install zookeeperd)"
    return None


def answers(port: int) -> bool:
    """True if a ZooKeeper server answers ``srvr`` on ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), 1) as sock:
            sock.sendall(b"srvr")
            return sock.recv(64).startswith(b"Zookeeper version")
    except OSError:
        return False


@dataclass
class ZooKeeperServer:
    """One standalone server in ``folder``; ``start`` and ``stop`` may be called again."""

    folder: Path
    tick_ms: int = 100
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start (or restart, on the same port and data) and wait until it answers."""
        self.port = self.port or free_port()
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        config = self.folder / "zoo.cfg"
        config.write_text(
            f"tickTime={self.tick_ms}\ndataDir={self.folder / 'data'}\n"
            f"clientPort={self.port}\nclientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n4lw.commands.whitelist=srvr,wchc\n"
        )
        log = (self.folder / "server.log").open("ab")
        self.process = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", str(JAR), MAIN, str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not answers(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ZooKeeper did not start: see {self.folder / 'server.log'}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Kill the server (by its PID) and wait for it."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, 9)
            self.process.wait()
        self.process = None
