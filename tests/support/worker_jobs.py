"""Handlers run by worker subprocesses in tests/client/test_worker.py (``python -m
cluster_dq.client.worker tests.support.worker_jobs:sleepy``): each start and end of a job is a line in
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


async def stubborn(job: Job) -> None:
    """Sleeps, and swallows every cancellation (a careless handler): never ends."""
    note("start", job)
    while True:
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            note("cancelled", job)


def main() -> None:
    """``python -m tests.support.worker_jobs HANDLER QUEUE SHUTDOWN_TIMEOUT``: a program of its own
    calling ``Worker.run()`` (the library's entry point, not the command's), then returning."""
    import logging
    import sys

    from cluster_dq.client import AsyncClient, Worker

    logging.basicConfig(level=logging.INFO)
    name, queue, timeout = sys.argv[1:4]
    client = AsyncClient()  # CLUSTER_DQ_URL, _TOKEN, _NAMESPACE
    worker = Worker(client, queue, globals()[name], shutdown_timeout=float(timeout))
    worker.run()
    print("run() returned", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
