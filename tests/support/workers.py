"""Worker processes and waits of the worker suites: a ``python -m cluster_dq.client.worker``
child whose handler (``tests/support/worker_jobs.py``) logs each start and end of a job, the log
read back, and a worker run until a condition holds."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cluster_dq.client.worker import Worker
from tests.support import ROOT

NS = "ns"


def worker_process(
    dq: tuple[str, str], log: Path, *args: str, handler: str = "tests.support.worker_jobs:sleepy"
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CLUSTER_DQ_URL": dq[0],
        "CLUSTER_DQ_TOKEN": dq[1],
        "CLUSTER_DQ_NAMESPACE": NS,
        "DQ_WORKER_LOG": str(log),
    }
    cmd = [sys.executable, "-m", "cluster_dq.client.worker", handler, *args]
    with open(log.with_suffix(".stderr"), "ab") as err:  # the child keeps its own copy
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stderr=err)


@contextmanager
def reaped(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """``proc``, killed and waited for on the way out if it still runs (a test that failed
    before its process ended leaves none behind)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def lines(log: Path, what: str) -> list[list[str]]:
    if not log.exists():
        return []
    return [ln.split()[1:] for ln in log.read_text().splitlines() if ln.startswith(what + " ")]


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    stop = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < stop, "timed out"
        time.sleep(0.05)


async def run_until(worker: Worker, done: Any, timeout: float = 30.0) -> None:
    """Runs ``worker`` until ``done()`` holds, then stops it (gracefully)."""
    serving = asyncio.create_task(worker.serve())
    stop = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < stop and not serving.done(), "worker did not get there"
        await asyncio.sleep(0.02)
    await worker.stop()
    await serving
