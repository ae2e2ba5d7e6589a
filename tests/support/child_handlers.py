"""Handlers for ``Worker(isolation="process")`` tests: module-level, so a child process
imports them by name. Each job's body is JSON ``{"do": ..., "dir": ...}``; every call writes
``<dir>/<job id>.<delivery>`` holding the pid of the process that ran it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cluster_dq.client import Job

_held: list[bytearray] = []  # what "grow" keeps: the child's memory stays high


def _note(path: Path, text: str) -> None:
    """Writes ``path`` whole or not at all (a tmp file renamed): the tests poll the directory
    and read what they find, which must never be a file created and not written yet."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)


def act(job: Job) -> str:
    body = job.json()
    _note(Path(body["dir"], f"{job.id}.{job.deliveries}"), str(os.getpid()))
    do = body["do"]
    if do == "grow":
        _held.append(bytearray(256 << 20))  # touched: resident, not only reserved
    elif do == "crash-once" and job.deliveries == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    elif do == "exit-once" and job.deliveries == 1:
        os._exit(3)
    elif do == "hang":
        time.sleep(60)
    elif do == "sleep":
        time.sleep(float(body.get("seconds", 1)))
    elif do == "exit":
        sys.exit(3)
    elif do == "spawn-hang":  # a handler that shells out, then hangs
        sleeper = subprocess.Popen(["sleep", "60"])
        _note(Path(body["dir"], f"{job.id}.sleeper"), str(sleeper.pid))
        time.sleep(60)
    elif do == "fork":  # a copy made by fork() that raises, back into the child's loop
        copy = os.fork()
        if copy == 0:
            raise ValueError("in the copy")
        os.waitpid(copy, 0)
    elif do == "term-sub":  # a handler that ends its own subprocess with terminate()
        sub = subprocess.Popen(["sleep", "30"])
        sub.terminate()
        return str(sub.wait(5))
    elif do == "boom":
        raise ValueError("boom in a child")
    elif do == "unpicklable":
        return lambda: None  # type: ignore[return-value]
    return "done"
