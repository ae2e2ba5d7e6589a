"""The service's edges against hostile clients and careless setups (issue 25): the Host
allowlist on both ports (DNS rebinding), one header field bounded before it is buffered, slow
and idle connections closed by the header, body and keep-alive timeouts, open connections
bounded per worker, and uvicorn's log lines written once. Through real sockets against a real
``cluster-dq serve`` process and a real redis-server."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cluster_dq.localredis import Server
from cluster_dq.testing.service_process import ServiceProcess
from tests.test_http import ADMIN_AUTH, serve


def worker_pids(svc: ServiceProcess) -> list[int]:
    """The supervisor's children (its workers: with a pool configured, no redis-server)."""
    text = Path(f"/proc/{svc.pid}/task/{svc.pid}/children").read_text()
    return [int(p) for p in text.split()]


# -- (21) every uvicorn log line once ---------------------------------------------------------


def test_no_log_line_is_written_twice(redis_server: Server) -> None:
    """Each worker serves two ports with two uvicorn servers: their start and stop lines were
    both written ("Started server process [pid]" twice, "Shutting down" twice, ...)."""
    log = Path(tempfile.mkstemp(prefix="dq-edge-log-", suffix=".log")[1])
    try:
        svc = serve(
            f"127.0.0.1:{redis_server.port}",
            stderr=log,
            CLUSTER_DQ_LOGLEVEL="info",
            CLUSTER_DQ_ENABLEACCESSLOG="true",
        )
        try:
            assert httpx.get(f"{svc.admin}/healthz").status_code == 200
            r = httpx.get(f"{svc.admin}/token/edge", auth=ADMIN_AUTH)
            assert r.status_code == 200
        finally:
            assert svc.stop(timeout=20) == 0
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        seen: dict[str, int] = {}
        for line in lines:
            key = json.dumps({k: v for k, v in line.items() if k != "ts"}, sort_keys=True)
            seen[key] = seen.get(key, 0) + 1
        twice = [k for k, n in seen.items() if n > 1]
        assert not twice, twice
        assert not [line for line in lines if "color_message" in line]  # terminal escapes
        # the requests and the worker's life are still logged
        assert sum(1 for line in lines if line.get("path") == "/token/edge") == 1
        assert any(line["msg"] == "worker started" for line in lines)
        assert any(line["msg"] == "worker stopped" for line in lines)
    finally:
        log.unlink()
