"""The service's edges against hostile clients and careless setups (issue 25): the Host
allowlist on both ports (DNS rebinding), one header field bounded before it is buffered, slow
and idle connections closed by the header, body and keep-alive timeouts, open connections
bounded per worker, and uvicorn's log lines written once. Through real sockets against a real
``cluster-dq serve`` process and a real redis-server."""

from __future__ import annotations

import json
import select
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cluster_dq.localredis import Server
from cluster_dq.testing.service_process import ServiceProcess
from tests.test_http import ADMIN_AUTH, serve


def worker_pids(svc: ServiceProcess) -> list[int]:
    """The supervisor's worker processes (spawned children; not its resource tracker)."""
    text = Path(f"/proc/{svc.pid}/task/{svc.pid}/children").read_text()
    pids = [int(p) for p in text.split()]
    return [p for p in pids if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


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


# -- raw sockets ------------------------------------------------------------------------------

MB = 1024 * 1024


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def read_until_closed(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection (b"" if it closed without a
    word); raises TimeoutError if it is still open after ``timeout``."""
    sock.settimeout(timeout)
    out = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not data:
            return out
        out += data


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def served(redis_server: Server) -> Iterator[ServiceProcess]:
    """One service for the module, one worker, default settings."""
    svc = serve(f"127.0.0.1:{redis_server.port}", CLUSTER_DQ_WORKERS="1")
    yield svc
    svc.stop(timeout=20)


# -- (3) one header field bounded before it is buffered ---------------------------------------


def test_a_huge_header_field_is_refused_after_little_data(served: ServiceProcess) -> None:
    """httptools buffers a header name or value across reads and hands it over only when it
    is complete: the 64 KiB check came after the whole field (32 MiB: 1.8 s of CPU)."""
    sock = connect(served.base)
    with sock:
        sock.sendall(b"GET /api/ns/q HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Huge: ")
        sent, chunk = 0, b"a" * 16384
        while sent < 4 * MB:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
            if select.select([sock], [], [], 0.05)[0]:
                break  # answered
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert b"too large" in answer.split(b"\r\n\r\n", 1)[1]
    assert sent <= 256 * 1024  # refused soon after 64 KiB, not at the end of the field


def test_unfinished_huge_headers_do_not_grow_the_worker(served: ServiceProcess) -> None:
    """Four unfinished 16 MiB header fields held +80 MiB in the worker."""
    (worker,) = worker_pids(served)
    assert httpx.get(f"{served.base}/healthz").status_code in (200, 404)
    before = rss_kib(worker)
    socks = [connect(served.base) for _ in range(4)]
    try:
        for sock in socks:
            sock.sendall(b"PUT /api/ns/q HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Huge: ")
            try:
                for _ in range(16):
                    sock.sendall(b"b" * MB)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused and closed: what should happen
        time.sleep(0.5)
        grown = rss_kib(worker) - before
    finally:
        for sock in socks:
            sock.close()
    assert grown < 16 * 1024, f"worker RSS grew by {grown} KiB"
