"""``Worker(isolation="process")``: sync handlers in child processes, against a real service.
A child that dies under a job releases it with an error and is replaced; a child is replaced
after ``max_tasks_per_child`` jobs and once its memory passed ``max_memory_per_child``; a
time limit kills the child, so the handler really stops; a stop ends every child."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from cluster_dq.client import AsyncClient, Backoff, Job
from cluster_dq.client.worker import Worker
from tests.support.child_handlers import act
from tests.support.workers import run_until, worker_process

QUICK = Backoff("fixed", 0.2)


def ran(where: Path) -> dict[str, int]:
    """``<job id>.<delivery>`` -> the pid that ran it."""
    return {p.name: int(p.read_text()) for p in where.iterdir()}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


async def publish(client: AsyncClient, q: str, where: Path, *dos: str, **kw: Any) -> list[str]:
    return [await client.publish(q, json.dumps({"do": do, "dir": str(where)}), **kw) for do in dos]


async def test_children_run_the_jobs_and_are_replaced_after_their_tasks(
    solo: AsyncClient, tmp_path: Path
) -> None:
    ids = await publish(solo, "iso-tasks", tmp_path, *["noop"] * 5)
    worker = Worker(
        solo,
        "iso-tasks",
        act,
        concurrency=1,
        poll_timeout=0.2,
        isolation="process",
        max_tasks_per_child=2,
    )
    await run_until(worker, lambda: worker.counts["acked"] >= 5, timeout=60)
    pids = [ran(tmp_path)[f"{i}.1"] for i in ids]
    assert os.getpid() not in pids
    assert [pids.count(p) for p in dict.fromkeys(pids)] == [2, 2, 1]  # in order, 2 per child
    await ended(pids[-1])  # the stop ends the last one too


async def ended(pid: int) -> None:
    for _ in range(100):  # (the pool's thread tells it to end; it is gone within moments)
        if not alive(pid):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"child {pid} still alive")


async def test_a_child_that_dies_under_a_job_releases_it_with_an_error_and_is_replaced(
    solo: AsyncClient, tmp_path: Path
) -> None:
    crash, exits, boom = await publish(
        solo, "iso-die", tmp_path, "crash-once", "exit-once", "boom", tries=3, backoff=QUICK
    )
    worker = Worker(solo, "iso-die", act, concurrency=1, poll_timeout=0.2, isolation="process")
    done = lambda: worker.counts["acked"] >= 2 and worker.counts["released"] >= 3  # noqa: E731
    await run_until(worker, done, timeout=60)
    seen = ran(tmp_path)
    assert seen[f"{crash}.1"] != seen[f"{crash}.2"]  # killed, then taken again by a new child
    assert seen[f"{exits}.1"] != seen[f"{exits}.2"]
    failed = await solo.get_job("iso-die", boom)
    assert failed is not None and failed.last_error is not None
    assert failed.last_error.startswith("ValueError: boom in a child")
    for jid in (crash, exits):  # acked on the second delivery: gone
        assert await solo.get_job("iso-die", jid) in (None,) or (
            (await solo.get_job("iso-die", jid)).state == "acked"  # type: ignore[union-attr]
        )
    assert worker._executor is not None and worker._executor.replaced["died"] == 2  # type: ignore[attr-defined]


async def test_a_dying_childs_error_names_how_it_died(solo: AsyncClient, tmp_path: Path) -> None:
    (crash,) = await publish(
        solo, "iso-why", tmp_path, "crash-once", tries=2, backoff=Backoff("fixed", 60.0)
    )
    worker = Worker(solo, "iso-why", act, concurrency=1, poll_timeout=0.2, isolation="process")
    await run_until(worker, lambda: worker.counts["released"] >= 1, timeout=60)
    job = await solo.get_job("iso-why", crash)
    assert job is not None and job.last_error is not None
    assert job.last_error.startswith("ChildDied: the handler's process ")
    assert job.last_error.endswith(" was killed by SIGKILL")


async def test_a_child_past_its_memory_is_replaced(solo: AsyncClient, tmp_path: Path) -> None:
    ids = await publish(solo, "iso-mem", tmp_path, "noop", "noop", "grow", "noop")
    worker = Worker(
        solo,
        "iso-mem",
        act,
        concurrency=1,
        poll_timeout=0.2,
        isolation="process",
        max_memory_per_child=200,  # a child starts far below; "grow" takes it past
    )
    await run_until(worker, lambda: worker.counts["acked"] >= 4, timeout=60)
    pids = [ran(tmp_path)[f"{i}.1"] for i in ids]
    assert pids[0] == pids[1] == pids[2] != pids[3]


async def test_a_time_limit_kills_the_child_and_frees_the_slot(
    solo: AsyncClient, tmp_path: Path
) -> None:
    hang, quick = await publish(
        solo, "iso-limit", tmp_path, "hang", "noop", tries=2, backoff=Backoff("fixed", 60.0)
    )
    worker = Worker(
        solo,
        "iso-limit",
        act,
        concurrency=1,
        poll_timeout=0.2,
        isolation="process",
        time_limit=1.0,
    )
    await run_until(worker, lambda: worker.counts["acked"] >= 1, timeout=60)
    seen = ran(tmp_path)
    await ended(seen[f"{hang}.1"])  # stopped at the limit, not left running
    assert seen[f"{quick}.1"] != seen[f"{hang}.1"]
    job = await solo.get_job("iso-limit", hang)
    assert job is not None and job.last_error is not None
    assert job.last_error.startswith("TimeLimitExceeded")


async def test_a_stop_kills_a_child_still_running_and_gives_its_job_back(
    solo: AsyncClient, tmp_path: Path
) -> None:
    (hang,) = await publish(solo, "iso-stop", tmp_path, "hang", tries=2)
    worker = Worker(
        solo,
        "iso-stop",
        act,
        concurrency=1,
        poll_timeout=0.2,
        isolation="process",
        shutdown_timeout=0.5,
    )
    await run_until(worker, lambda: any(tmp_path.iterdir()), timeout=60)
    await ended(ran(tmp_path)[f"{hang}.1"])
    job = await solo.get_job("iso-stop", hang)
    assert job is not None and (job.state, job.remain_tries) == ("ready", 2)  # unspent


async def test_a_result_that_cannot_come_back_fails_the_job(
    solo: AsyncClient, tmp_path: Path
) -> None:
    (bad,) = await publish(
        solo, "iso-result", tmp_path, "unpicklable", tries=2, backoff=Backoff("fixed", 60.0)
    )
    worker = Worker(solo, "iso-result", act, concurrency=1, poll_timeout=0.2, isolation="process")
    await run_until(worker, lambda: worker.counts["released"] >= 1, timeout=60)
    job = await solo.get_job("iso-result", bad)
    assert job is not None and job.last_error is not None
    assert "cannot be sent back" in job.last_error


def test_process_isolation_refuses_what_it_cannot_run() -> None:
    client: Any = object()

    async def coroutine(job: Job) -> None:
        return None

    with pytest.raises(ValueError, match="module-level function"):
        Worker(client, "q", lambda job: None, isolation="process").isolation.pool(
            1, lambda j: None, False
        )
    with pytest.raises(ValueError, match="sync handlers"):
        Worker(client, "q", coroutine, isolation="process").isolation.pool(1, coroutine, True)
    with pytest.raises(ValueError, match="isolation must be"):
        Worker(client, "q", act, isolation="fork")
    with pytest.raises(ValueError, match="need isolation='process'"):
        Worker(client, "q", act, max_tasks_per_child=3)
    with pytest.raises(ValueError, match="integer >= 1"):
        Worker(client, "q", act, isolation="process", max_memory_per_child=0)


async def test_the_command_runs_children_and_a_killed_worker_leaves_none_behind(
    solo_dq: tuple[str, str], solo: AsyncClient, tmp_path: Path
) -> None:
    """``--isolation process --max-tasks-per-child 1``: a child per job. Then the worker is
    killed (SIGKILL: no shutdown runs) while its child is in a handler that would run a
    minute: the child notices its parent is gone and ends."""
    where = tmp_path / "ran"
    where.mkdir()
    ids = await publish(solo, "iso-cli", where, "noop", "noop", "noop", "hang")
    args = ["-q", "iso-cli", "--isolation", "process", "--max-tasks-per-child", "1"]
    proc = worker_process(
        solo_dq,
        tmp_path / "log",
        *args,
        "--concurrency",
        "1",
        "--poll-timeout",
        "0.2",
        handler="tests.support.child_handlers:act",
    )
    try:
        for _ in range(600):
            if len(list(where.iterdir())) == 4:
                break
            await asyncio.sleep(0.05)
        seen = ran(where)
        pids = [seen[f"{i}.1"] for i in ids]
        assert len(set(pids)) == 4 and proc.pid not in pids
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        await ended(pids[-1])
    finally:
        proc.kill()
        proc.wait(10)
