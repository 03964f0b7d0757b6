"""Throw-away redis-server processes (single nodes and a Cluster) for tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    for _ in range(1000):
        port = random.randrange(20000, 30000)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


@dataclass
class Server:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


class RedisServers:
    """Starts redis-server processes on free loopback ports; stops every one by PID."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.started: list[Server] = []

    def start(self, *extra: str, port: int | None = None) -> Server:
        """Start one server (no persistence) and wait until it answers PING."""
        port = port or free_port()
        folder = self.workdir / str(port)
        folder.mkdir(exist_ok=True)
        argv = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(folder),
            *extra,
        ]  # fmt: skip
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server = Server(port, process)
        self.started.append(server)
        client = redis.Redis(port=port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.02)
            finally:
                client.close()
        return server

    def restart(self, server: Server) -> Server:
        """Start a stopped server again on the same port (its data is gone)."""
        self.stop(server)
        return self.start(port=server.port)

    def stop(self, server: Server) -> None:
        """Kill the server by PID and reap it."""
        if server.alive():
            os.kill(server.pid, signal.SIGKILL)
        server.process.wait(10)

    def stop_all(self) -> None:
        for server in self.started:
            with contextlib.suppress(Exception):
                self.stop(server)

    def cluster(self, masters: int = 3) -> list[Server]:
        """Start ``masters`` cluster-enabled nodes and join them into one Cluster."""
        nodes = [
            self.start(
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                port=free_cluster_port(),
            )
            for _ in range(masters)
        ]  # fmt: skip
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        cli = self.binary.replace("redis-server", "redis-cli")
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=60,
        )
        deadline = time.monotonic() + 20
        for node in nodes:
            client = redis.Redis(port=node.port)
            try:
                while client.cluster("info").get("cluster_state") != "ok":
                    if time.monotonic() > deadline:
                        raise RuntimeError("the Redis Cluster did not converge")
                    time.sleep(0.05)
            finally:
                client.close()
        return nodes


@contextlib.contextmanager
def private_redis(db: int = 0) -> Iterator[str]:
    """The URL of a redis-server started for the caller alone, stopped on exit (benchmarks)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH (or pass --url to use a running Redis)")
    with tempfile.TemporaryDirectory() as folder:
        servers = RedisServers(binary, Path(folder))
        try:
            yield f"redis://127.0.0.1:{servers.start().port}/{db}"
        finally:
            servers.stop_all()
