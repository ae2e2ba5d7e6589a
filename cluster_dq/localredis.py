"""Starts and stops local redis-server processes on loopback (embedded mode, tests, drills).

Topologies: a standalone server, and a Cluster of 3 masters + 3 replicas. Every server binds
127.0.0.1 only, never a default port, keeps no files outside its own directory, and is
configured for this queue (noeviction; listpack limits that keep wheel buckets compact).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

QUEUE_CONFIG = [
    "maxmemory-policy", "noeviction",
    "hash-max-listpack-entries", "512",
    "hash-max-listpack-value", "128",
    "save", "",
    "appendonly", "no",
]  # fmt: skip


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError(
            "redis-server not found: install it (Debian: apt-get install redis-server)"
        )
    return found


def free_port(start: int = 17000, end: int = 18000) -> int:
    """A free loopback port whose cluster-bus twin (+10000) is free too (the callers' ranges
    never include Redis's default ports)."""
    for port in range(start, end):
        if all(_port_free(p) for p in (port, port + 10000)):
            return port
    raise RuntimeError(f"no free port in {start}-{end}")


def _port_free(port: int) -> bool:
    if port > 65535:
        return False
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class Server:
    port: int
    workdir: Path
    process: subprocess.Popen[bytes]
    extra: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        self.process = _spawn(self.port, self.workdir, self.extra)
        _wait_ready(self.port)


def _spawn(port: int, workdir: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    args = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(workdir), "--daemonize", "no", "--protected-mode", "yes",
            "--logfile", str(workdir / "redis.log")]  # fmt: skip
    for i in range(0, len(QUEUE_CONFIG), 2):
        args += [f"--{QUEUE_CONFIG[i]}", QUEUE_CONFIG[i + 1]]
    return subprocess.Popen(
        args + extra, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def _wait_ready(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping():
                return
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def start_server(port: int | None = None, workdir: Path | None = None, extra: list[str] | None = None) -> Server:
    port = port or free_port()
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"cluster-dq-redis-{port}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    server = Server(port, workdir, _spawn(port, workdir, extra or []), extra or [])
    _wait_ready(port)
    return server


@dataclass
class Cluster:
    servers: list[Server]

    @property
    def seeds(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.servers]

    @property
    def url(self) -> str:
        return ",".join(f"redis://127.0.0.1:{s.port}" for s in self.servers[:3])

    def stop(self) -> None:
        for s in self.servers:
            s.kill(signal.SIGTERM)
            shutil.rmtree(s.workdir, ignore_errors=True)


def start_cluster(base_port: int | None = None, node_timeout_ms: int = 2000) -> Cluster:
    """3 masters + 3 replicas on consecutive ports; returns once the cluster state is ok."""
    if base_port is None:
        base_port = next(p for p in range(17100, 17900, 10)
                         if all(_port_free(p + i) and _port_free(p + i + 10000) for i in range(6)))  # fmt: skip
    servers = []
    for i in range(6):
        port = base_port + i
        servers.append(start_server(port, extra=[
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms),
            "--cluster-require-full-coverage", "yes",
        ]))  # fmt: skip
    nodes = [f"127.0.0.1:{s.port}" for s in servers]
    cmd = [shutil.which("redis-cli") or "redis-cli", "--cluster", "create", *nodes,
           "--cluster-replicas", "1", "--cluster-yes"]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        infos = [s.client().cluster("info") for s in servers]
        if all(i.get("cluster_state") == "ok" for i in infos):
            return Cluster(servers)
        time.sleep(0.1)
    raise RuntimeError("cluster did not reach state ok in 30 s")


def main(argv: list[str] | None = None) -> int:
    """``python -m cluster_dq.localredis standalone|cluster``: start one and wait for Ctrl-C."""
    argv = argv if argv is not None else sys.argv[1:]
    kind = argv[0] if argv else "standalone"
    if kind == "cluster":
        cluster = start_cluster()
        print("cluster seeds:", cluster.url, flush=True)
        stop = cluster.stop
    else:
        server = start_server()
        print("redis:", server.url, flush=True)
        stop = lambda: server.kill(signal.SIGTERM)  # noqa: E731
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
