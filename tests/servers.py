"""Throw-away redis-server processes (single nodes, a Cluster, a Sentinel group) for tests
and benchmarks."""

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


class _PortTaken(RuntimeError):
    """The port was free when chosen, and taken before the server bound it."""


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

    def start(self, *extra: str, port: int | None = None, config: str | None = None) -> Server:
        """Start one server (no persistence) and wait until it answers PING.

        ``config`` is written to a file the server is started with (Sentinel needs one
        it can rewrite). A free port chosen here may be taken by another process (an
        xdist worker) before the server binds it: then another is tried.
        """
        if port is not None:
            return self._start(port, extra, config)
        for _ in range(4):
            with contextlib.suppress(_PortTaken):
                return self._start(free_port(), extra, config)
        return self._start(free_port(), extra, config)

    def _start(self, port: int, extra: tuple[str, ...], config: str | None) -> Server:
        folder = self.workdir / str(port)
        folder.mkdir(exist_ok=True)
        conf: list[str] = []
        if config is not None:
            (folder / "redis.conf").write_text(config)
            conf = [str(folder / "redis.conf")]
        argv = [
            self.binary,
            *conf,
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
                if process.poll() is not None and not _bindable(port):
                    self.started.remove(server)
                    raise _PortTaken(port) from None
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

    def cluster(
        self, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 15000
    ) -> list[Server]:
        """Start ``masters`` cluster-enabled nodes (and ``replicas`` replicas of each) and
        join them into one Cluster.

        ``node_timeout_ms``: how long a node may not answer before the others fail it
        over (a short one lets a test see a replica promoted in a second or two).
        """
        nodes = [
            self.start(
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms),
                port=free_cluster_port(),
            )
            for _ in range(masters * (1 + replicas))
        ]  # fmt: skip
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        _create_cluster(self.binary.replace("redis-server", "redis-cli"), addresses, replicas)
        deadline = time.monotonic() + 20
        for node in nodes:
            client = redis.Redis(port=node.port)
            try:
                while not _converged(client):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the Redis Cluster did not converge")
                    time.sleep(0.05)
            finally:
                client.close()
        return nodes

    def sentinel_group(
        self, replicas: int = 1, sentinels: int = 3, name: str = "headway"
    ) -> SentinelGroup:
        """A primary, ``replicas`` replicas and ``sentinels`` Sentinels watching them.

        Returns once every Sentinel knows every replica, so a failover can start.
        """
        primary = self.start()
        copies = [
            self.start("--replicaof", "127.0.0.1", str(primary.port)) for _ in range(replicas)
        ]
        # Quorum: a majority. Short timeouts so a failover takes about a second.
        config = (
            f"sentinel monitor {name} 127.0.0.1 {primary.port} {sentinels // 2 + 1}\n"
            f"sentinel down-after-milliseconds {name} 1000\n"
            f"sentinel failover-timeout {name} 5000\n"
            f"sentinel parallel-syncs {name} 1\n"
        )
        watchers = [self.start("--sentinel", config=config) for _ in range(sentinels)]
        group = SentinelGroup(name, primary, copies, watchers)
        group.wait_until_known(replicas)
        return group


@dataclass
class SentinelGroup:
    """A Sentinel-managed primary and its replicas (started by ``RedisServers``)."""

    name: str
    primary: Server
    replicas: list[Server]
    sentinels: list[Server]

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The Sentinels' addresses, as ``redis.sentinel.Sentinel`` takes them."""
        return [("127.0.0.1", server.port) for server in self.sentinels]

    def primary_port(self) -> int:
        """The port of the primary the first Sentinel names now."""
        client = redis.Redis(port=self.sentinels[0].port, decode_responses=True)
        try:
            command = "SENTINEL GET-MASTER-ADDR-BY-NAME"
            _host, port = client.execute_command(command, self.name)  # type: ignore[no-untyped-call]
            return int(port)
        finally:
            client.close()

    def wait_until_known(self, replicas: int, timeout: float = 30.0) -> None:
        """Wait until every Sentinel lists ``replicas`` healthy replicas and the others."""
        deadline = time.monotonic() + timeout
        for sentinel in self.sentinels:
            client = redis.Redis(port=sentinel.port, decode_responses=True)
            try:
                while not self._ready(client, replicas):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the Sentinels did not discover the group")
                    time.sleep(0.05)
            finally:
                client.close()

    def _ready(self, client: redis.Redis, replicas: int) -> bool:
        known = client.execute_command("SENTINEL REPLICAS", self.name)  # type: ignore[no-untyped-call]
        healthy = [r for r in known if "down" not in _fields(r).get("flags", "")]
        master = _fields(client.execute_command("SENTINEL MASTER", self.name))  # type: ignore[no-untyped-call]
        others = int(master.get("num-other-sentinels", 0))
        return len(healthy) >= replicas and others >= len(self.sentinels) - 1

    def failover(self) -> None:
        """Ask a Sentinel to promote a replica now (``SENTINEL FAILOVER``)."""
        client = redis.Redis(port=self.sentinels[0].port)
        try:
            client.execute_command("SENTINEL FAILOVER", self.name)  # type: ignore[no-untyped-call]
        finally:
            client.close()


def _converged(client: redis.Redis) -> bool:
    """The node sees the Cluster whole and, if it is a replica, is in sync."""
    if client.cluster("info").get("cluster_state") != "ok":
        return False
    replication = client.info("replication")
    return bool(replication["role"] == "master" or replication.get("master_link_status") == "up")


def _fields(reply: object) -> dict[str, str]:
    # Sentinel answers a flat [name, value, ...] list (RESP2) or a map (RESP3).
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    assert isinstance(reply, list)
    return dict(zip(map(str, reply[::2]), map(str, reply[1::2]), strict=True))


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


def _create_cluster(cli: str, addresses: list[str], replicas: int) -> None:
    """``redis-cli --cluster create`` over fresh nodes; tried twice, as it failed once in
    a CI run with nothing said (its output was dropped then): what it prints is kept now,
    and raised with the error if the second try fails too."""
    argv = [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas),
            "--cluster-yes"]  # fmt: skip
    said = []
    for _ in range(2):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode == 0:
            return
        said.append((done.stdout + done.stderr)[-2000:])
    raise RuntimeError("redis-cli --cluster create failed twice:\n" + "\n---\n".join(said))
