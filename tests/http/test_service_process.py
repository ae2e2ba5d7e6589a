"""The helper every test, drill, profile and benchmark starts the service with: ready when it
says so, its log captured, a failed start reported with the service's own words, a stop that
escalates, and a port of its own for each of two services started at once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from cluster_dq.localredis import PORT_SLICE, ephemeral_ports, free_block, free_port, port_share
from cluster_dq.testing.service_process import ServiceProcess
from loadtest import history


def test_start_wait_log_and_stop(tmp_path: Path) -> None:
    dead = free_port(19500, 20000)  # nothing listens: the service starts and says so
    env = {"CLUSTER_DQ_LOGLEVEL": "warning", "CLUSTER_DQ_LOGFORMAT": "text"}
    with (
        ServiceProcess.start(f"127.0.0.1:{dead}", env=env, log=tmp_path / "a.log") as a,
        ServiceProcess.start(f"127.0.0.1:{dead}", env=env, log=tmp_path / "b.log") as b,
    ):
        assert a.answers("/healthz") and b.answers("/healthz")
        assert len({a.port, a.admin_port, b.port, b.admin_port}) == 4
        assert "pool default unreachable at start-up" in a.logs()
    assert a.proc.returncode == 0 and b.proc.returncode == 0  # SIGTERM: a clean stop


def test_a_failed_start_raises_with_the_service_s_words(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"exit code 2\)[\s\S]*Shards: 1\.\.4096"):
        ServiceProcess.start(
            "127.0.0.1:1", env={"CLUSTER_DQ_SHARDS": "0"}, log=tmp_path / "serve.log"
        )


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    svc = ServiceProcess.start("127.0.0.1:1", env={"CLUSTER_DQ_LOGLEVEL": "error"}, session=True)
    svc.proc.send_signal(signal.SIGSTOP)  # a stopped supervisor cannot act on SIGTERM
    assert svc.stop(timeout=1) == -signal.SIGKILL


def test_no_port_is_picked_from_the_kernel_s_ephemeral_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port the kernel may hand to an outgoing connection (a client's to Redis) is not ours
    to listen on: a service picked there found it "already in use" once it came to bind. On a
    machine whose ephemeral range covers a whole range, its ports are still picked (not
    refused: the embedded service and the tests must run there too)."""
    monkeypatch.delenv(PORT_SLICE, raising=False)  # the whole ranges (ports are only looked at)
    low, _ = ephemeral_ports()
    assert all(free_port(low - 50, low + 50) < low for _ in range(20))
    # a Cluster node listens on its port and on its bus port, 10000 above: both below
    assert all(free_block(3, low - 10_060, low - 9_940) + 2 + 10_000 < low for _ in range(5))
    assert low <= free_port(low + 100, low + 200) < low + 200  # inside only: still picked
    assert port_share(low - 100, low + 100) == (low - 100, low + 100)  # not refused
    # the history drill's instances listen below Linux's default ephemeral range
    assert history.PORTS[1] <= 32768
