"""``Worker(isolation="process")``: sync handlers in child processes, against a real service.
A child that dies under a job releases it with an error and is replaced; a child is replaced
after ``max_tasks_per_child`` jobs and once its memory passed ``max_memory_per_child``; a
time limit kills the child, so the handler really stops; a stop ends every child."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cluster_dq.client import AsyncClient, Backoff, Job
from cluster_dq.client.worker import Worker
from tests.support import ROOT
from tests.support.child_handlers import act
from tests.support.workers import run_until, worker_process

QUICK = Backoff("fixed", 0.2)


def notes(where: Path) -> list[Path]:
    """The files the handlers wrote whole in ``where`` (child_handlers._note: not its tmp files)."""
    return [p for p in where.iterdir() if not p.name.startswith(".")]


def ran(where: Path) -> dict[str, int]:
    """``<job id>.<delivery>`` -> the pid that ran it."""
    return {p.name: int(p.read_text()) for p in notes(where)}


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
    await run_until(worker, lambda: any(notes(tmp_path)), timeout=60)
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
            lambda j: None, False
        )
    with pytest.raises(ValueError, match="sync handlers"):
        Worker(client, "q", coroutine, isolation="process").isolation.pool(coroutine, True)
    with pytest.raises(ValueError, match="isolation must be"):
        Worker(client, "q", act, isolation="fork")
    with pytest.raises(ValueError, match="need isolation='process'"):
        Worker(client, "q", act, max_tasks_per_child=3)
    with pytest.raises(ValueError, match="integer >= 1"):
        Worker(client, "q", act, isolation="process", max_memory_per_child=0)
    with pytest.raises(ValueError, match="at most 512"):
        Worker(client, "q", act, isolation="process", concurrency=513)


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
            if len(notes(where)) == 4:
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


async def test_a_handler_that_exits_ends_its_child_not_the_worker(
    solo: AsyncClient, tmp_path: Path
) -> None:
    """``sys.exit()`` in a handler ends its process, like any other child's end: the job is
    released with ChildDied (a try spent) and the worker goes on. (It was carried back as
    SystemExit and stopped the worker, the job given back unspent: a crash loop.)"""
    bye, after = await publish(
        solo, "iso-exit", tmp_path, "exit", "noop", tries=2, backoff=Backoff("fixed", 60.0)
    )
    worker = Worker(solo, "iso-exit", act, concurrency=1, poll_timeout=0.2, isolation="process")
    await run_until(worker, lambda: worker.counts["acked"] >= 1, timeout=60)
    job = await solo.get_job("iso-exit", bye)
    assert job is not None and (job.state, job.remain_tries) == ("delayed", 1)
    assert job.last_error == (
        f"ChildDied: the handler's process {ran(tmp_path)[f'{bye}.1']} exited with status 3"
    )
    assert f"{after}.1" in ran(tmp_path)


async def test_a_time_limit_kills_what_the_handler_started(
    solo: AsyncClient, tmp_path: Path
) -> None:
    """A handler that shells out: at its time limit the child is killed with what it
    started (its own process group), not only the child."""
    (hang,) = await publish(
        solo, "iso-group", tmp_path, "spawn-hang", tries=2, backoff=Backoff("fixed", 60.0)
    )
    worker = Worker(
        solo,
        "iso-group",
        act,
        concurrency=1,
        poll_timeout=0.2,
        isolation="process",
        time_limit=1.0,
    )
    await run_until(worker, lambda: worker.counts["time_limited"] >= 1, timeout=60)
    await ended(int((tmp_path / f"{hang}.sleeper").read_text()))
    await ended(ran(tmp_path)[f"{hang}.1"])


async def test_no_process_for_a_job_gives_it_back_unspent(
    solo: AsyncClient, tmp_path: Path
) -> None:
    """A child dies and no other can be started (the OS refuses a process): the next job is
    given back without spending a try, saying why, rather than failing towards the dead
    letter as a crash would."""
    crash, later = await publish(
        solo, "iso-none", tmp_path, "crash-once", "noop", tries=2, backoff=Backoff("fixed", 60.0)
    )
    worker = Worker(solo, "iso-none", act, concurrency=1, poll_timeout=0.2, isolation="process")
    await worker.start()
    pool: Any = worker._executor
    pool._start = lambda name: None  # every start from now on refused
    try:
        for _ in range(600):
            if worker.counts["released"] >= 1 and worker.counts["snoozed"] >= 1:
                break
            await asyncio.sleep(0.05)
    finally:
        await worker.stop()
    job = await solo.get_job("iso-none", later)
    assert job is not None and (job.state, job.remain_tries) == ("delayed", 2)  # unspent
    assert job.last_error == "NoProcess: no process could be started for it"
    crashed = await solo.get_job("iso-none", crash)
    assert crashed is not None and crashed.remain_tries == 1


def test_a_script_that_starts_a_worker_unguarded_fails_at_start(
    solo_dq: tuple[str, str], tmp_path: Path
) -> None:
    """Each child imports the worker's script: one without ``if __name__ == "__main__":``
    would start a worker in every child. The worker fails at its start, saying so, before it
    takes a job (every job was dead-lettered as 'no process could be started')."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from cluster_dq.client import AsyncClient, Worker\n"
        "from tests.support.child_handlers import act\n"
        f"client = AsyncClient({solo_dq[0]!r}, {solo_dq[1]!r}, 'ns')\n"
        "Worker(client, 'iso-unguarded', act, isolation='process', concurrency=1).run()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode != 0
    assert "if __name__ == '__main__':" in out.stderr, out.stderr[-2000:]


async def test_a_sigterm_to_the_whole_group_lets_the_running_job_finish(
    solo_dq: tuple[str, str], solo: AsyncClient, tmp_path: Path
) -> None:
    """systemd's KillMode=control-group (kill -TERM -PGID) reaches the children and the
    forkserver too: they leave stopping to the worker, so a job running at the signal
    finishes within the shutdown timeout and is acked (its child was killed: ChildDied)."""
    where = tmp_path / "ran"
    where.mkdir()
    body = json.dumps({"do": "sleep", "seconds": 2, "dir": str(where)})
    jid = await solo.publish("iso-term", body)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CLUSTER_DQ_URL": solo_dq[0],
        "CLUSTER_DQ_TOKEN": solo_dq[1],
        "CLUSTER_DQ_NAMESPACE": "ns",
    }
    cmd = [sys.executable, "-m", "cluster_dq.client.worker", "tests.support.child_handlers:act"]
    cmd += ["-q", "iso-term", "--isolation", "process", "--concurrency", "1"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True)
    try:
        for _ in range(600):
            if any(notes(where)):
                break
            await asyncio.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    job = await solo.get_job("iso-term", jid)
    assert job is None or (job.state, job.result) == ("acked", "done")


async def test_a_forkserver_killed_under_a_running_job_neither_fails_it_nor_runs_it_twice(
    solo: AsyncClient, tmp_path: Path
) -> None:
    """The forkserver's end closes what multiprocessing watches for a child's end: the job
    was failed ("exited with status 255") while its handler ran on, and then ran again. A
    child's own pidfd tells its end now: the job finishes, once."""
    from multiprocessing import forkserver

    slow, after = await publish(solo, "iso-fs", tmp_path, "sleep", "noop", tries=2)
    worker = Worker(solo, "iso-fs", act, concurrency=1, poll_timeout=0.2, isolation="process")
    serving = asyncio.create_task(worker.serve())
    try:
        for _ in range(600):
            if f"{slow}.1" in ran(tmp_path):
                break
            await asyncio.sleep(0.05)
        server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        assert server is not None
        os.kill(server, signal.SIGKILL)
        for _ in range(600):
            if worker.counts["acked"] >= 2:
                break
            await asyncio.sleep(0.05)
    finally:
        await worker.stop()
        await serving
    assert worker.counts["acked"] == 2 and worker.counts["released"] == 0
    assert sorted(ran(tmp_path)) == sorted([f"{slow}.1", f"{after}.1"])


async def test_a_handler_module_that_does_not_import_in_a_child_fails_the_start(
    solo: AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler imports in the worker but not in a new process: the worker's start says
    so, and no job is touched (every job failed towards the dead letter in milliseconds)."""
    (tmp_path / "only_here.py").write_text(
        "import os\n"
        f"if os.getpid() != {os.getpid()}:\n"
        "    raise ImportError('not in a child')\n"
        "def handle(job):\n"
        "    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here  # type: ignore[import-not-found]

    (jid,) = await publish(solo, "iso-import", tmp_path, "noop")
    worker = Worker(solo, "iso-import", only_here.handle, isolation="process", poll_timeout=0.2)
    with pytest.raises(RuntimeError, match="did not load there: ImportError"):
        await worker.start()
    await worker.stop()
    job = await solo.get_job("iso-import", jid)
    assert job is not None and (job.state, job.deliveries) == ("ready", 0)


async def test_a_handler_that_forks_leaves_its_copy_no_say(
    solo: AsyncClient, tmp_path: Path
) -> None:
    """A copy of the child made by the handler's fork() that raises came back into the
    child's loop and answered on its pipe: the job was failed by the copy's error while the
    handler ran, and the copy took later jobs. It ends now; each job is acked once."""
    ids = await publish(solo, "iso-fork", tmp_path, "fork", "noop", "fork", tries=1)
    worker = Worker(solo, "iso-fork", act, concurrency=1, poll_timeout=0.2, isolation="process")
    await run_until(worker, lambda: worker.counts["acked"] >= 3, timeout=60)
    assert worker.counts == {**worker.counts, "acked": 3, "released": 0, "buried": 0}
    assert len({ran(tmp_path)[f"{i}.1"] for i in ids}) == 1  # one child ran them all


async def test_a_handlers_subprocess_ends_on_terminate_and_the_apps_own_processes_too(
    solo: AsyncClient, tmp_path: Path
) -> None:
    """A child lets SIGTERM pass with a handler that does nothing, not by ignoring it: an
    ignored signal stays ignored across exec, so a handler's ``terminate()`` of its own
    subprocess did nothing (5 s, then a timeout). And the forkserver is left as it is: the
    program's own forkserver processes still end at ``terminate()``."""
    import multiprocessing

    (jid,) = await publish(solo, "iso-sub", tmp_path, "term-sub", tries=1)
    worker = Worker(solo, "iso-sub", act, concurrency=1, poll_timeout=0.2, isolation="process")
    await run_until(worker, lambda: worker.counts["acked"] + worker.counts["released"] >= 1)
    assert worker.counts["acked"] == 1
    done = await solo.get_job("iso-sub", jid)
    assert done is None or done.result == str(-signal.SIGTERM)
    own = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(30,))
    own.start()
    own.terminate()
    await asyncio.to_thread(own.join, 10)
    assert own.exitcode == -signal.SIGTERM


@pytest.mark.parametrize("seen", ["seen-before", "seen-at-send"])
async def test_a_child_that_died_idle_is_replaced_before_the_next_job(
    solo: AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seen: str
) -> None:
    """A child killed while idle (the OOM killer, an operator): the next job was sent to it
    and failed as ChildDied, a try spent, though it never ran. It is replaced first now; and
    when its death is seen only once the job was sent (the look before missed it), the job,
    which the child never confirmed, goes to a new child."""
    if seen == "seen-at-send":
        from cluster_dq.client import _processes

        monkeypatch.setattr(_processes._Child, "gone", lambda self: False)
    (first,) = await publish(solo, "iso-idle", tmp_path, "noop", tries=1)
    worker = Worker(solo, "iso-idle", act, concurrency=1, poll_timeout=0.2, isolation="process")
    serving = asyncio.create_task(worker.serve())
    try:
        for _ in range(600):
            if worker.counts["acked"] >= 1:
                break
            await asyncio.sleep(0.05)
        os.kill(ran(tmp_path)[f"{first}.1"], signal.SIGKILL)
        await ended(ran(tmp_path)[f"{first}.1"])
        (second,) = await publish(solo, "iso-idle", tmp_path, "noop", tries=1)
        for _ in range(600):
            if worker.counts["acked"] >= 2 or worker.counts["released"]:
                break
            await asyncio.sleep(0.05)
    finally:
        await worker.stop()
        await serving
    assert (worker.counts["acked"], worker.counts["released"]) == (2, 0)


@pytest.mark.parametrize("how", ["startup-fails", "never-stopped"])
def test_a_program_whose_worker_did_not_stop_still_exits(
    solo_dq: tuple[str, str], tmp_path: Path, how: str
) -> None:
    """Idle children ignored the SIGTERM multiprocessing's exit sends them, and it then waited
    on them for ever: a worker whose on_startup failed, or one never stopped, hung its
    program at exit. Its children are ended at exit now."""
    script = tmp_path / "prog.py"
    script.write_text(
        "import asyncio\n"
        "from cluster_dq.client import AsyncClient, Worker\n"
        "from tests.support.child_handlers import act\n"
        "def boom(worker):\n"
        "    raise RuntimeError('no database')\n"
        "async def main():\n"
        f"    client = AsyncClient({solo_dq[0]!r}, {solo_dq[1]!r}, 'ns')\n"
        f"    startup = boom if {how!r} == 'startup-fails' else None\n"
        "    worker = Worker(client, 'iso-exit-prog', act, isolation='process', concurrency=2,\n"
        "                    on_startup=startup, announce=False)\n"
        "    try:\n"
        "        await worker.start()\n"
        "    except RuntimeError as e:\n"
        "        print('start failed:', e)\n"
        "    await client.aclose()\n"
        "if __name__ == '__main__':\n"
        "    asyncio.run(main())\n"
        "    print('exiting')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "exiting" in out.stdout and time.monotonic() - started < 30
