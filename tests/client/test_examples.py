"""The scripts of examples/ run as a user runs them (subprocesses configured by
CLUSTER_DQ_URL / CLUSTER_DQ_TOKEN / CLUSTER_DQ_NAMESPACE) against a real ``cluster-dq serve``
on a standalone Redis: they only use the client, whose topology suites are elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from cluster_dq.client import Client
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH

from tests.support import ROOT


@pytest.fixture
def service(solo_served: ServiceProcess) -> tuple[str, str]:
    return solo_served.base, solo_served.admin


@pytest.fixture
def env(service: tuple[str, str]) -> dict[str, str]:
    base, admin = service
    ns = f"ex{uuid.uuid4().hex[:10]}"
    r = httpx.post(f"{admin}/token/{ns}", params={"description": "examples"}, auth=ADMIN_AUTH)
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("CLUSTER_DQ_")},
        "PYTHONPATH": str(ROOT),
        "CLUSTER_DQ_URL": base,
        "CLUSTER_DQ_TOKEN": r.json()["token"],
        "CLUSTER_DQ_NAMESPACE": ns,
    }


def client_of(env: dict[str, str]) -> Client:
    return Client(env["CLUSTER_DQ_URL"], env["CLUSTER_DQ_TOKEN"], env["CLUSTER_DQ_NAMESPACE"])


def example(name: str, env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_producer_then_worker_retries_snoozes_buries_and_stops_gracefully(
    env: dict[str, str],
) -> None:
    out = example("producer.py", env, "orders")
    assert "order 42: close-order-42 (due in 1 s; published twice, one job)" in out
    with client_of(env) as dq:
        s = dq.size("orders")
        assert (s.ready, s.delayed, s.reserved, s.dead) == (5, 2, 0, 0)  # one job for id 42
        worker = subprocess.Popen(
            [sys.executable, str(ROOT / "examples/worker.py"), "orders"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while (s := dq.size("orders")).total != s.dead or s.dead != 1:
                assert time.monotonic() < deadline, f"the worker left {s}"
                assert worker.poll() is None, worker.communicate()
                time.sleep(0.1)
            worker.send_signal(signal.SIGTERM)
            out, err = worker.communicate(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
        assert worker.returncode == 0, err[-2000:]
        lines = out.splitlines()
        for order in (1, 2, 3, 4, 42):  # however often the rate limit snoozed it: no try spent
            assert f"done order {order} (delivery 1)" in lines, out
        assert "retry order 5: upstream timed out" in lines
        assert "done order 5 (delivery 2)" in lines  # the retry spent a try
        assert lines[-1] == "worker: stopped"
        (dead,) = dq.dead_jobs("orders").jobs
        assert (dead.reason, dead.last_error) == ("buried", "bad payload: not JSON")


def test_recurring_publishes_occurrences_under_their_own_ids(env: dict[str, str]) -> None:
    out = example("recurring.py", env, "reports")
    got = [line for line in out.splitlines() if line.startswith("got ")]
    assert len(got) == 2 and all(line.startswith("got s-heartbeat-") for line in got), out
    assert got[0] != got[1]
    assert "heartbeat deleted; daily-report stays: True" in out
    with client_of(env) as dq:
        assert dq.get_schedule("reports", "heartbeat") is None
        daily = dq.get_schedule("reports", "daily-report")
        assert daily is not None and daily.cron == "0 8 * * *" and daily.tz == "Europe/Paris"
