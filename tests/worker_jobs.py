"""Handlers run by worker subprocesses in tests/test_worker.py (``python -m
cluster_dq.client.worker tests.worker_jobs:sleepy``): each start and end of a job is a line in
the file named by DQ_WORKER_LOG, so the test sees what ran where."""

from __future__ import annotations

import asyncio
import os
import time

from cluster_dq.client.models import Job


def note(what: str, job: Job) -> None:
    with open(os.environ["DQ_WORKER_LOG"], "a") as f:
        f.write(f"{what} {job.id} {job.deliveries} {os.getpid()}\n")


async def sleepy(job: Job) -> None:
    """Sleeps the body's number of seconds."""
    note("start", job)
    await asyncio.sleep(float(job.body))
    note("done", job)


def sleepy_sync(job: Job) -> None:
    """``sleepy`` as a plain function (run in a thread)."""
    note("start", job)
    time.sleep(float(job.body))
    note("done", job)


def exits_sync(job: Job) -> None:
    """Body ``exit``: ``sys.exit(3)``; else ``sleepy_sync``."""
    note("start", job)
    if job.body == b"exit":
        raise SystemExit(3)
    time.sleep(float(job.body))
    note("done", job)
