"""Starts and stops local redis-server processes on loopback (embedded mode, tests, drills).

Topologies: a standalone server, a Cluster of 3 masters + 3 replicas, and a Sentinel group
(1 master + 2 replicas + 3 sentinels). Every server binds 127.0.0.1 only, never a default port,
keeps no files outside its own directory, and is configured for this queue (noeviction;
listpack limits that keep wheel buckets compact). Each topology gives the ``PoolSettings``
that point the service at it, and a plain (sync) client for tests and drills.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.sentinel import Sentinel

from cluster_dq import envvars
from cluster_dq.settings import PoolSettings

MASTER_NAME = "dq-master"

QUEUE_CONFIG = [
    "maxmemory-policy",
    "noeviction",
    "hash-max-listpack-entries",
    "512",
    "hash-max-listpack-value",
    "128",
    "save",
    "",
    "appendonly",
    "no",
    "repl-diskless-sync-delay",
    "0",  # replicas sync at once (the default waits 5 s)
]


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError(
            "redis-server not found: install it (Debian: apt-get install redis-server)"
        )
    return found


def free_port(start: int = 17000, end: int = 18000) -> int:
    """A free loopback port whose cluster-bus twin (+10000) is free too (the callers' ranges
    never include Redis's default ports). The scan starts at a random place in the range, so
    two processes looking at once rarely pick the same port between the check and the bind;
    processes that must never collide (parallel test workers) each take a disjoint share of
    every range (``PORT_SLICE``)."""
    start, end = port_share(start, end)
    first = random.randrange(start, end)
    order = listenable([*range(first, end), *range(start, first)], lambda p: (p,))
    for port in order:
        if all(port_free(p) for p in (port, port + 10000)):
            return port
    raise RuntimeError(f"no free port in {start}-{end}")


def free_block(n: int, start: int = 17000, end: int = 18000) -> int:
    """The first of ``n`` consecutive free loopback ports (each with its cluster-bus twin), at a
    multiple of 10 in this process's share of the range, scanned from a random place."""
    start, end = port_share(start, end)
    bases = list(range(start + (-start) % 10, end - n + 1, 10))
    if not bases:
        raise RuntimeError(f"no block of {n} ports in {start}-{end}")
    first = random.randrange(len(bases))

    def ports(base: int) -> list[int]:
        return [p for i in range(n) for p in (base + i, base + i + 10000)]

    for base in listenable([*bases[first:], *bases[:first]], ports):
        if all(port_free(p) for i in range(n) for p in (base + i, base + i + 10000)):
            return base
    raise RuntimeError(f"no {n} free consecutive ports in {start}-{end}")


# ``i/n``: this process (and its children) takes the i-th of n equal shares of every port range
# (set by the test run for each of its workers, so that no two workers race for a port).
PORT_SLICE = "DQ_PORT_SLICE"


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (``[low, high]``)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def listenable(candidates: list[int], uses: Callable[[int], Iterable[int]]) -> list[int]:
    """``candidates`` less those that would listen on an ephemeral port (``uses``: the ports a
    candidate listens on): there, any outgoing connection may take the port picked as free
    before its server binds it. All of them on a machine whose ephemeral range covers them."""
    low, high = ephemeral_ports()
    safe = [c for c in candidates if not any(low <= p <= high for p in uses(c))]
    return safe or candidates


def port_share(start: int, end: int) -> tuple[int, int]:
    """The part of ``[start, end)`` this process may take (all of it without ``PORT_SLICE``)."""
    spec = os.environ.get(PORT_SLICE)
    if not spec:
        return start, end
    i, n = (int(part) for part in spec.split("/"))
    width = (end - start) // n
    if not 0 <= i < n or width < 1:
        raise RuntimeError(f"{PORT_SLICE}={spec} leaves no port of {start}-{end}")
    return start + i * width, start + (i + 1) * width


def port_free(port: int) -> bool:
    """Nothing listens on (or holds) 127.0.0.1:``port``."""
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

    def pool_settings(self, name: str = "default") -> PoolSettings:
        return PoolSettings(name, Addr=f"127.0.0.1:{self.port}")

    def sync_client(self) -> redis.Redis:
        return self.client()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        if self.process.poll() is not None:  # not the directory of a server still running
            shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        self.process = _spawn(self.port, self.workdir, self.extra)
        _wait_ready(self.port, process=self.process)


def _spawn(port: int, workdir: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    args = [
        redis_server_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(workdir),
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
        "--logfile",
        str(workdir / "redis.log"),
    ]
    for i in range(0, len(QUEUE_CONFIG), 2):
        args += [f"--{QUEUE_CONFIG[i]}", QUEUE_CONFIG[i + 1]]
    return subprocess.Popen(
        args + extra,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _wait_ready(
    port: int, timeout: float = 10.0, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Until the redis-server on ``port`` answers; with ``process``, it must be that one (a
    port taken since it was found free is answered by another, and ``process`` exits)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1) as r:
                pid = r.info("server")["process_id"]
            if process is None or pid == process.pid:
                return
            raise RuntimeError(f"127.0.0.1:{port} is taken by another redis-server (pid {pid})")
        except redis.RedisError:
            if process is not None and process.poll() is not None:
                raise RuntimeError(
                    f"the redis-server for 127.0.0.1:{port} exited ({process.returncode})"
                ) from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def start_server(
    port: int | None = None, workdir: Path | None = None, extra: list[str] | None = None
) -> Server:
    port = port or free_port()
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"cluster-dq-redis-{port}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    server = Server(port, workdir, _spawn(port, workdir, extra or []), extra or [])
    try:
        _wait_ready(port, process=server.process)
    except BaseException:
        server.kill()
        raise
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

    def pool_settings(self, name: str = "default") -> PoolSettings:
        return PoolSettings(
            name, Addr=",".join(f"127.0.0.1:{s.port}" for s in self.servers[:3]), Cluster=True
        )

    def sync_client(self) -> redis.RedisCluster:
        from redis.cluster import ClusterNode

        nodes = [ClusterNode("127.0.0.1", s.port) for s in self.servers]  # type: ignore[no-untyped-call]
        return redis.RedisCluster(startup_nodes=nodes)

    def server_on(self, port: int) -> Server:
        return next(s for s in self.servers if s.port == port)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


@dataclass
class SentinelGroup:
    """1 master + 2 replicas + 3 sentinels (quorum 2, down-after 1 s)."""

    servers: list[Server]  # [0] is the first master; after a failover any may be
    sentinels: list[Server]
    master_name: str = MASTER_NAME

    @property
    def sentinel_addrs(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def pool_settings(self, name: str = "default") -> PoolSettings:
        return PoolSettings(
            name,
            Addr=",".join(f"127.0.0.1:{s.port}" for s in self.sentinels),
            MasterName=self.master_name,
        )

    def master_port(self) -> int:
        """The current master, as the sentinels see it."""
        sentinel = Sentinel(self.sentinel_addrs, socket_timeout=1.0)  # type: ignore[no-untyped-call]
        try:
            _, port = sentinel.discover_master(self.master_name)  # type: ignore[no-untyped-call]
            return int(port)
        finally:
            for client in sentinel.sentinels:
                client.close()

    def sync_client(self) -> redis.Redis:
        """A plain client of the current master (ask again after a failover)."""
        return redis.Redis(host="127.0.0.1", port=self.master_port())

    def master(self) -> Server:
        port = self.master_port()
        return next(s for s in self.servers if s.port == port)

    def stop(self) -> None:
        for s in self.sentinels + self.servers:
            s.stop()


def start_cluster(
    base_port: int | None = None,
    node_timeout_ms: int = 2000,
    *,
    masters: int = 3,
    replicas: int = 1,
    full_coverage: bool = True,
) -> Cluster:
    """``masters`` masters (3 unless told) with ``replicas`` replicas each, on consecutive ports
    (the masters first, then their replicas); returns once the cluster state is ok.
    ``full_coverage``: ``cluster-require-full-coverage`` (no: the masters that are up go on
    serving their slots while one is failed, until its replica is promoted)."""
    count = masters * (1 + replicas)
    if not (masters == 1 and replicas == 0 or masters >= 3 and replicas >= 0) or count > 10:
        raise ValueError(f"{masters} masters x {replicas} replicas: 1 x 0, or 3+, <= 10 nodes")
    if base_port is None:
        base_port = free_block(count)
    servers = []
    for i in range(count):
        port = base_port + i
        servers.append(
            start_server(
                port,
                extra=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(node_timeout_ms),
                    "--cluster-require-full-coverage",
                    "yes" if full_coverage else "no",
                ],
            )
        )
    if masters >= 3:  # redis-cli's own layout (it refuses fewer than 3 masters)
        nodes = [f"127.0.0.1:{s.port}" for s in servers]
        cmd = [
            shutil.which("redis-cli") or "redis-cli",
            "--cluster",
            "create",
            *nodes,
            "--cluster-replicas",
            str(replicas),
            "--cluster-yes",
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    else:  # one master (redis-cli refuses fewer than 3): every slot its own
        with servers[0].client() as c:
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ok = True
        for s in servers:  # every node sees state ok, and every replica finished its sync
            with s.client() as c:
                repl = c.info("replication")
                ok = ok and c.cluster("info").get("cluster_state") == "ok"
                ok = ok and (repl.get("role") == "master" or repl.get("master_link_status") == "up")
        if ok:
            return Cluster(servers)
        time.sleep(0.1)
    raise RuntimeError("cluster did not reach state ok (replicas in sync) in 30 s")


def _sentinel_config(workdir: Path, port: int, master_port: int, down_after_ms: int) -> Path:
    conf = workdir / "sentinel.conf"
    conf.write_text(
        "\n".join(
            [
                f"port {port}",
                "bind 127.0.0.1",
                f"dir {workdir}",
                f"logfile {workdir / 'sentinel.log'}",
                "protected-mode yes",
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2",
                f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}",
                f"sentinel failover-timeout {MASTER_NAME} 5000",
                f"sentinel parallel-syncs {MASTER_NAME} 1",
            ]
        )
        + "\n"
    )
    return conf


def start_sentinel(
    base_port: int | None = None, down_after_ms: int = 1000, min_replicas: int = 1
) -> SentinelGroup:
    """Master on base, replicas on base+1..2, sentinels on base+3..5; returns once every
    sentinel knows both replicas and the other two sentinels. Each server refuses writes
    (NOREPLICAS) while it is a master with fewer than ``min_replicas`` replicas connected
    (``min-replicas-to-write``): a master paused past a failover that comes back cannot take
    writes it would lose when the sentinels demote it."""
    if base_port is None:
        base_port = free_block(6)
    guard = ["--min-replicas-to-write", str(min_replicas), "--min-replicas-max-lag", "10"]
    master = start_server(base_port, extra=guard)
    replicas = [
        start_server(base_port + i, extra=[*guard, "--replicaof", "127.0.0.1", str(base_port)])
        for i in (1, 2)
    ]
    sentinels = []
    for i in (3, 4, 5):
        port = base_port + i
        workdir = Path(tempfile.mkdtemp(prefix=f"cluster-dq-sentinel-{port}-"))
        conf = _sentinel_config(workdir, port, base_port, down_after_ms)
        proc = subprocess.Popen(
            [redis_server_binary(), str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        sentinels.append(Server(port, workdir, proc, ["--sentinel"]))
    group = SentinelGroup([master, *replicas], sentinels)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            states: list[Any] = []
            for s in sentinels:
                with redis.Redis(port=s.port, socket_timeout=1) as c:
                    states.append(c.sentinel_master(MASTER_NAME))
            synced = True
            for r in replicas:
                with r.client() as c:
                    synced = synced and c.info("replication").get("master_link_status") == "up"
            if synced and all(
                st["num-slaves"] == 2 and st["num-other-sentinels"] == 2 for st in states
            ):
                return group
        except redis.RedisError:
            pass
        time.sleep(0.1)
    group.stop()
    raise RuntimeError("sentinel group did not settle in 30 s")


def migrate_slot(
    cluster: Cluster, slot: int, source_port: int, target_port: int, batch: int = 100
) -> int:
    """Moves one hash slot between masters the way redis-cli --cluster reshard does
    (IMPORTING/MIGRATING, MIGRATE in batches, SETSLOT NODE everywhere). Returns keys moved."""
    masters = [s for s in cluster.servers if s.client().info("replication")["role"] == "master"]
    with redis.Redis(port=source_port) as src, redis.Redis(port=target_port) as dst:
        src_id, dst_id = (
            src.execute_command("CLUSTER", "MYID"),
            dst.execute_command("CLUSTER", "MYID"),
        )
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
            src.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    for m in masters:
        if m.port not in (source_port, target_port):
            with m.client() as c:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    return moved


STATE_DIR = Path(
    os.environ.get(envvars.LOCAL_DIR, Path(tempfile.gettempdir()) / "cluster-dq-local")
)
BASE_PORTS = {"standalone": 17379, "cluster": 17001, "sentinel": 17101}
Deployment = Server | Cluster | SentinelGroup


def _members(d: Deployment) -> list[Server]:
    if isinstance(d, Server):
        return [d]
    if isinstance(d, Cluster):
        return d.servers
    return d.servers + d.sentinels


def _describe(kind: str, d: Deployment) -> dict[str, object]:
    pool = d.pool_settings()
    env = {"CLUSTER_DQ_POOL__DEFAULT__ADDR": pool.Addr}
    if pool.Cluster:
        env["CLUSTER_DQ_POOL__DEFAULT__CLUSTER"] = "true"
    if pool.MasterName:
        env["CLUSTER_DQ_POOL__DEFAULT__MASTERNAME"] = pool.MasterName
    return {
        "kind": kind,
        "env": env,
        "members": [
            {"port": m.port, "pid": m.process.pid, "dir": str(m.workdir)} for m in _members(d)
        ],
    }


def _alive(state: dict[str, object]) -> bool:
    members: list[dict[str, object]] = state["members"]  # type: ignore[assignment]
    for m in members:
        try:
            os.kill(int(m["pid"]), 0)  # type: ignore[call-overload]
            with redis.Redis(port=int(m["port"]), socket_timeout=1) as c:  # type: ignore[call-overload]
                c.ping()
        except (OSError, redis.RedisError):
            return False
    return True


def up(kind: str) -> dict[str, object]:
    """Starts ``kind`` on its fixed loopback ports unless it already runs (idempotent)."""
    path = STATE_DIR / f"{kind}.json"
    if path.exists():
        state: dict[str, object] = json.loads(path.read_text())
        if _alive(state):
            return state
        down(kind)  # half dead: start afresh
    base = BASE_PORTS[kind]
    d: Deployment
    if kind == "cluster":
        d = start_cluster(base)
    elif kind == "sentinel":
        d = start_sentinel(base)
    else:
        d = start_server(base)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state = _describe(kind, d)
    path.write_text(json.dumps(state, indent=1))
    return state


def down(kind: str) -> bool:
    path = STATE_DIR / f"{kind}.json"
    if not path.exists():
        return False
    state = json.loads(path.read_text())
    for m in state["members"]:
        with contextlib.suppress(OSError):
            os.kill(int(m["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + 10
    for m in state["members"]:
        while time.monotonic() < deadline:
            try:
                os.kill(int(m["pid"]), 0)
            except OSError:
                break
            time.sleep(0.05)
        shutil.rmtree(m["dir"], ignore_errors=True)
    path.unlink()
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m cluster_dq.localredis up|down|status standalone|cluster|sentinel``"""
    argv = argv if argv is not None else sys.argv[1:]
    if len(argv) != 2 or argv[0] not in ("up", "down", "status") or argv[1] not in BASE_PORTS:
        print(
            "usage: deploy/local/redis up|down|status standalone|cluster|sentinel", file=sys.stderr
        )
        return 2
    action, kind = argv
    if action == "down":
        print(f"{kind}: {'stopped' if down(kind) else 'was not running'}")
        return 0
    if action == "status":
        path = STATE_DIR / f"{kind}.json"
        state = json.loads(path.read_text()) if path.exists() else None
        if not state or not _alive(state):
            print(f"{kind}: not running")
            return 1
    else:
        state = up(kind)
    members: list[dict[str, object]] = state["members"]  # type: ignore[assignment]
    print(f"{kind}: running on 127.0.0.1 ports {', '.join(str(m['port']) for m in members)}")
    env: dict[str, str] = state["env"]  # type: ignore[assignment]
    print("point the service at it with:")
    for k, v in env.items():
        print(f"  export {k}={v}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
