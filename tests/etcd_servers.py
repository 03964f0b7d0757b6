"""A throw-away etcd cluster on free loopback ports, for tests (stopped by PID)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers import free_port


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class EtcdCluster:
    """``size`` etcd members started from ``binary``; ``stop``/``start`` one by PID."""

    binary: str
    workdir: Path
    size: int = 3
    members: list[Member] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.members = [Member(f"m{i}", free_port(), free_port()) for i in range(self.size)]

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.members]

    def start_all(self) -> None:
        for member in self.members:
            self.start(member)
        self.wait_for_leader(30)

    def start(self, member: Member) -> None:
        """Start ``member`` (again, with its data, if it ran before)."""
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        argv = [
            self.binary,
            "--name", member.name,
            "--data-dir", str(self.workdir / member.name),
            "--listen-client-urls", member.url,
            "--advertise-client-urls", member.url,
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", initial,
            "--initial-cluster-token", f"headway-{self.workdir.name}",
            # Short terms: a lost leader is replaced within a second or so.
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
        ]  # fmt: skip
        log = (self.workdir / f"{member.name}.log").open("ab")
        member.process = subprocess.Popen(argv, stdout=log, stderr=log)
        log.close()

    def stop(self, member: Member) -> None:
        """Kill ``member`` by PID (SIGKILL: a crash, not a goodbye) and reap it."""
        if member.process is not None:
            if member.alive():
                os.kill(member.process.pid, signal.SIGKILL)
            member.process.wait(10)

    def stop_all(self) -> None:
        for member in self.members:
            with contextlib.suppress(Exception):
                self.stop(member)

    def status(self, member: Member) -> dict[str, object] | None:
        request = urllib.request.Request(
            f"{member.url}/v3/maintenance/status", data=b"{}", method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=0.5) as reply:
                status: dict[str, object] = json.load(reply)
                return status
        except OSError:
            return None

    def leader(self) -> Member | None:
        """The member that is the leader, as a live member sees it."""
        for member in self.members:
            if member.alive() and (status := self.status(member)) is not None:
                header = status["header"]
                assert isinstance(header, dict)
                if status.get("leader") == header.get("member_id"):
                    return member
        return None

    def wait_for_leader(self, seconds: float) -> Member:
        deadline = time.monotonic() + seconds
        while (leader := self.leader()) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the etcd cluster elected no leader")
            time.sleep(0.05)
        return leader
