"""The README's run command: with no pool configured, `cluster-dq serve` starts its own
redis-server, prints a working token and curl lines, serves, and stops its Redis on exit."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cluster_dq.localredis import free_port
from cluster_dq.testing.service_process import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]


def test_embedded_mode_end_to_end(tmp_path: Path) -> None:
    with (tmp_path / "out").open("w") as out:  # no pool, none of our CLUSTER_DQ_* settings
        svc = ServiceProcess.start(
            env={"CLUSTER_DQ_LOGLEVEL": "warning"},
            inherit_settings=False,
            ready=None,
            stdout=out,
            log=subprocess.STDOUT,
            cwd=tmp_path,
        )
    proc, port = svc.proc, svc.port
    try:
        deadline = time.monotonic() + 30
        text = ""
        while "Stop with Ctrl-C" not in text and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "out").read_text()
            time.sleep(0.1)
            text = (tmp_path / "out").read_text()
        token = re.search(r'namespace "demo": (\S+)', text)
        redis_addr = re.search(r"redis \(pool default\): 127\.0\.0\.1:(\d+)", text)
        assert token and redis_addr, text
        assert f"curl -X PUT -H 'X-Token: {token.group(1)}'" in text
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"X-Token": token.group(1)}
        ) as api:
            for _ in range(100):  # the worker may still be starting
                try:
                    r = api.put("/api/demo/hello", params={"delay_ms": 200}, content=b"hi")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            assert r.status_code == 201
            job = api.get("/api/demo/hello", params={"timeout": 5}).json()
            assert job["job_id"] == r.json()["job_id"] and job["elapsed_ms"] >= 200
        redis_pid = subprocess.run(
            ["pgrep", "-f", f"redis-server 127.0.0.1:{redis_addr.group(1)}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert redis_pid, "the embedded redis-server is not running"
    finally:
        svc.stop(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(int(redis_pid[0]), 0)
            time.sleep(0.1)
        except ProcessLookupError:
            break
    else:
        raise AssertionError("the embedded redis-server outlived the service")


@pytest.mark.parametrize("reuse_port", [False, True])
def test_a_port_in_use_is_refused_by_name_and_the_embedded_redis_stopped(
    tmp_path: Path, reuse_port: bool
) -> None:
    """Workers listen with SO_REUSEPORT; a port another process holds (even with
    SO_REUSEPORT, as a second instance's workers would) must still refuse the start."""
    port, admin = free_port(18000, 18500), free_port(18500, 19000)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTER_DQ_")}
    env.update(PYTHONPATH=str(ROOT), CLUSTER_DQ_LOGLEVEL="warning")
    before = embedded_redis_pids()
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port may be in TIME_WAIT
        if reuse_port:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "cluster_dq.cli",
                "serve",
                "--port",
                str(port),
                "--admin-port",
                str(admin),
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2, out.stderr
    assert (
        f"cluster-dq: Port: cannot listen on 127.0.0.1:{port}: Address already in use" in out.stderr
    )
    assert "Traceback" not in out.stderr
    assert embedded_redis_pids() <= before  # it started one (embedded mode), and stopped it


def embedded_redis_pids() -> set[int]:
    """redis-server processes working in an embedded-mode directory (Redis chdirs there)."""
    out = set()
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and (proc / "comm").read_text().strip() == "redis-server"
                and "cluster-dq-embedded-" in str((proc / "cwd").readlink())
            ):
                out.add(int(proc.name))
        except OSError:
            continue
    return out
