# ruff: noqa: F811  (the HTTP fixtures are imported from test_http and used as arguments)
"""The client's ``Worker`` against a real service: crashes (SIGKILL) and graceful stops
(SIGTERM) of worker processes lose no job and ack none twice; heartbeats keep a long job;
each outcome (ack, Retry, Snooze, Bury, a plain exception, bury_on) leaves the job as said;
the concurrency limit holds; the test mode decides as the real worker does."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from cluster_dq.client import AsyncClient, Backoff, BadRequest, Job, Unauthorized
from cluster_dq.client.errors import Conflict, NotFound
from cluster_dq.client.outcomes import (
    MAX_TEXT,
    Acked,
    Bury,
    Buried,
    Outcome,
    Released,
    Retry,
    Snooze,
    Snoozed,
    TimeLimitExceeded,
    clip,
    decide,
)
from cluster_dq.client.testing import arun_job, run_job
from cluster_dq.client.worker import Worker
from cluster_dq.localredis import Server
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH, ROOT
from tests.support.workers import NS, lines, reaped, run_until, wait_for, worker_process
from tests.support.run import examples


@pytest.fixture
def dq(service: tuple[str, str], sync_redis: redis.Redis) -> tuple[str, str]:
    """(data URL, token) of the module's service, over a flushed Redis."""
    base, admin = service
    r = httpx.post(f"{admin}/token/{NS}", params={"description": "worker"}, auth=ADMIN_AUTH)
    return base, str(r.json()["token"])


@pytest.fixture
async def client(dq: tuple[str, str]) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(dq[0], dq[1], NS, timeout=30) as c:
        yield c


# -- crashes and stops --------------------------------------------------------------------


async def test_a_worker_killed_mid_job_its_job_comes_back_after_the_ttr_and_is_acked_once(
    dq: tuple[str, str], client: AsyncClient, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    jid = await client.publish("crash", b"60", tries=3)
    with reaped(
        worker_process(dq, log, "--queue", "crash", "--ttr", "1", "--poll-timeout", "1")
    ) as proc:
        wait_for(lambda: lines(log, "start"))
        proc.kill()  # SIGKILL: no goodbye, the reservation stays until its ttr runs out
        proc.wait(10)
    seen: list[tuple[str, int]] = []

    async def handle(job: Job) -> None:
        seen.append((job.id, job.deliveries))

    worker = Worker(client, "crash", handle, ttr=1.0, poll_timeout=0.5)
    await run_until(worker, lambda: worker.counts["acked"] >= 1)
    assert seen == [(jid, 2)] and worker.counts["acked"] == 1
    # acked once: it is gone, and never delivered again (not even after another ttr)
    assert await client.get_job("crash", jid) is None
    await asyncio.sleep(1.2)
    assert await client.consume("crash", timeout=0.2) is None
    assert (await client.size("crash")).total == 0
    assert [ln[:2] for ln in lines(log, "start")] == [[jid, "1"]] and not lines(log, "done")


async def test_sigterm_lets_running_jobs_finish_then_gives_the_rest_back_unspent(
    dq: tuple[str, str], client: AsyncClient, tmp_path: Path
) -> None:
    """A stop with jobs in flight: the short ones finish and are acked, the long ones are
    given back without spending a try when ``--shutdown-timeout`` ends, and the process exits
    by then (plus the last long-poll); nothing stays reserved, nothing is lost."""
    log = tmp_path / "log"
    short = [await client.publish("term", b"0.5", tries=2) for _ in range(6)]
    long = [await client.publish("term", b"600", tries=2) for _ in range(6)]
    queued = await client.publish_many("term", ["0.1"] * 20, tries=2)  # not reached: no slots
    args = ["--queue", "term", "--concurrency", "12", "--shutdown-timeout", "2"]
    with reaped(worker_process(dq, log, *args, "--poll-timeout", "1", "--batch", "12")) as proc:
        wait_for(lambda: len(lines(log, "start")) >= 12)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        took = time.monotonic() - started
    assert code == 0, log.with_suffix(".stderr").read_text()
    assert took < 2 + 1 + 5  # shutdown_timeout + a long-poll + a margin for the interpreter
    done = {ln[0] for ln in lines(log, "done")}
    assert set(short) <= done and not done & set(long)
    sizes = await client.size("term")
    assert sizes.reserved == 0 and sizes.dead == 0
    for jid in short + long + queued:  # published = acked + given back (no try spent)
        job = await client.get_job("term", jid)
        if jid in done:
            assert job is None, job
        else:
            assert job is not None
            assert (job.state, job.remain_tries, job.deliveries) == ("ready", 2, 0), job


async def test_a_second_stop_forces_it(client: AsyncClient) -> None:
    """``stop(force=True)`` (a second signal) does not wait for running handlers; their
    jobs are given back all the same. (One job at a time: no second long-poll is in flight,
    which a forced stop cancels rather than awaits, and which could take the job given back
    before the service saw it cancelled: docs/worker.md.)"""
    jid = await client.publish("force", b"x", tries=1)
    started = asyncio.Event()

    async def stuck(job: Job) -> None:
        started.set()
        await asyncio.sleep(600)

    worker = Worker(client, "force", stuck, concurrency=1, shutdown_timeout=600, poll_timeout=0.2)
    serving = asyncio.create_task(worker.serve())
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.wait_for(worker.stop(force=True), 10)
    await serving
    job = await client.get_job("force", jid)
    assert job is not None and (job.state, job.remain_tries, job.deliveries) == ("ready", 1, 0)
    assert worker.counts["snoozed"] == 1


async def test_a_second_signal_forces_the_stop(
    solo_dq: tuple[str, str], solo: AsyncClient, tmp_path: Path
) -> None:
    """Topology-insensitive (signal handling is the worker process's own): standalone only.
    With a shutdown timeout of 10 minutes, a second SIGTERM ends the wait: the running jobs
    are given back with their tries and the process exits."""
    log = tmp_path / "log"
    ids = [await solo.publish("sig", b"600", tries=2) for _ in range(2)]
    args = ["--queue", "sig", "--shutdown-timeout", "600", "--poll-timeout", "0.5"]
    with reaped(worker_process(solo_dq, log, *args)) as proc:
        wait_for(lambda: len(lines(log, "start")) == 2)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None  # still waiting for the handlers
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log.with_suffix(".stderr").read_text()
    for jid in ids:
        job = await solo.get_job("sig", jid)
        assert job is not None and (job.state, job.remain_tries, job.deliveries) == (
            "ready",
            2,
            0,
        )


async def test_acks_wait_out_a_service_restart(
    redis_server: Server, standalone_redis: redis.Redis
) -> None:
    """Handlers finish while the service is down: their acks are kept and repeated (with
    their leases) until the service is back, and only then count as done; none is lost or
    acked twice. Topology-insensitive (the worker's retry, one service process): standalone."""
    suite = {"CLUSTER_DQ_ACCOUNTS__ADMIN": ADMIN_AUTH[1], "CLUSTER_DQ_LOGLEVEL": "warning"}
    svc = ServiceProcess.start(redis_server.pool_settings(), env=suite, timeout=20)
    try:
        r = httpx.post(f"{svc.admin}/token/{NS}", params={"description": "w"}, auth=ADMIN_AUTH)
        go, started = asyncio.Event(), []

        async def wait(job: Job) -> None:
            started.append(job.id)
            await go.wait()

        async with AsyncClient(svc.base, r.json()["token"], NS, retries=1) as client:
            ids = set(await client.publish_many("down", ["1"] * 20))
            worker = Worker(client, "down", wait, concurrency=20, ttr=60, poll_timeout=0.2)
            serving = asyncio.create_task(worker.serve())
            until = time.monotonic() + 30
            while len(started) < 20:
                assert time.monotonic() < until, started
                await asyncio.sleep(0.02)
            ports = svc.port, svc.admin_port
            svc.stop(timeout=20)
            go.set()  # the handlers return: their acks cannot be sent now
            await asyncio.sleep(1.0)
            assert worker.counts["acked"] == 0 and worker.counts["failed"] == 0
            svc = ServiceProcess.start(
                redis_server.pool_settings(), env=suite, ports=ports, timeout=20
            )
            until = time.monotonic() + 30
            while worker.counts["acked"] < 20:
                assert not serving.done() and time.monotonic() < until, worker.counts
                await asyncio.sleep(0.05)
            await worker.stop()
            await serving
            assert worker.counts == {**worker.counts, "acked": 20, "lost": 0, "failed": 0}
            assert set(started) == ids and (await client.size("down")).total == 0
    finally:
        svc.stop(timeout=20)


def library_process(dq: tuple[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``python -m tests.worker_jobs HANDLER QUEUE SHUTDOWN_TIMEOUT``: a program calling
    ``Worker.run()``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CLUSTER_DQ_URL": dq[0],
        "CLUSTER_DQ_TOKEN": dq[1],
        "CLUSTER_DQ_NAMESPACE": NS,
        "DQ_WORKER_LOG": str(log),
    }
    cmd = [sys.executable, "-m", "tests.support.worker_jobs", *args]
    with open(log.with_suffix(".stderr"), "ab") as err:
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stderr=err)


@pytest.mark.parametrize("form", ["command", "library"])
@pytest.mark.parametrize("handler", ["sleepy_sync", "stubborn"])
async def test_a_handler_that_never_ends_does_not_hold_the_process_past_the_shutdown_timeout(
    solo_dq: tuple[str, str], solo: AsyncClient, tmp_path: Path, form: str, handler: str
) -> None:
    """A thread cannot be cancelled, and an async handler may swallow its cancellation: past
    the shutdown timeout the job is given back unspent, a line names the handler and the job,
    and the process exits (before: a program calling ``Worker.run()`` never exited while the
    thread ran, the interpreter waiting for it; with a handler swallowing cancellations
    neither the command nor such a program ever exited). Topology-insensitive: standalone."""
    log = tmp_path / "log"
    jid = await solo.publish("stuck", b"600", tries=1)
    if form == "command":
        args = ["--queue", "stuck", "--shutdown-timeout", "0.5", "--poll-timeout", "0.5"]
        proc = worker_process(solo_dq, log, *args, handler=f"tests.support.worker_jobs:{handler}")
    else:
        proc = library_process(solo_dq, log, handler, "stuck", "0.5")
    with reaped(proc):
        wait_for(lambda: len(lines(log, "start")) == 1)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        took = time.monotonic() - started
    said = log.with_suffix(".stderr").read_text()
    assert code == 0, said
    # the promise is the shutdown timeout (0.5 s), then 1 s for cancelled tasks to end; the
    # bound is generous (a long-poll, the interpreter's exit on a busy machine)
    assert took < 0.5 + 1 + 5, said
    assert any(handler in ln and jid in ln and "still running" in ln for ln in said.splitlines())
    assert "GeneratorExit" not in said  # a task left behind, closed at exit: not a failure
    job = await solo.get_job("stuck", jid)
    assert job is not None and (job.state, job.remain_tries, job.deliveries) == ("ready", 1, 0)


async def test_a_program_calling_run_leaves_no_connection_unclosed(
    solo_dq: tuple[str, str], solo: AsyncClient, tmp_path: Path
) -> None:
    """``Worker(AsyncClient(), ...).run()``, the README's worker, stopped by SIGTERM: run()
    made the event loop the client's connections belong to and ends it, so it closes the
    client too (aiohttp warned of an unclosed session and connector at exit before)."""
    log = tmp_path / "log"
    jid = await solo.publish("tidy", b"0", tries=1)
    with reaped(library_process(solo_dq, log, "sleepy", "tidy", "5")) as proc:
        wait_for(lambda: len(lines(log, "done")) == 1)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    said = log.with_suffix(".stderr").read_text()
    assert code == 0 and "run() returned" in said, said
    assert "Unclosed" not in said, said
    assert await solo.get_job("tidy", jid) is None  # (acked)


# -- heartbeats ---------------------------------------------------------------------------


async def test_a_handler_running_three_ttrs_keeps_its_job(client: AsyncClient) -> None:
    jid = await client.publish("beat", b"x", tries=1)
    deliveries: list[int] = []

    async def slow(job: Job) -> str:
        deliveries.append(job.deliveries)
        await asyncio.sleep(6.0)  # 3 ttrs
        return "ok"

    # touched every ttr/2: a touch may come up to 1 s late on a loaded machine
    worker = Worker(client, "beat", slow, ttr=2.0, concurrency=2, poll_timeout=0.2)
    await run_until(worker, lambda: worker.counts["acked"] >= 1)
    assert deliveries == [1] and worker.counts == {**worker.counts, "acked": 1, "lost": 0}
    job = await client.get_job("beat", jid)  # acked with its result
    assert job is None or (job.state, job.result) == ("acked", "ok")
    assert (await client.size("beat")).total == 0


async def test_a_job_taken_back_during_its_handler_is_not_acked(
    client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease is lost while the handler runs (here: released by someone else, then
    taken by another consumer): the next touch says so, and the worker does not ack it."""
    jid = await client.publish("taken", b"x", tries=3)
    running, refused = asyncio.Event(), asyncio.Event()
    touch = client.touch

    async def watched_touch(*args: Any, **kwargs: Any) -> Any:
        try:
            return await touch(*args, **kwargs)
        except (Conflict, NotFound):  # the heartbeat's touch, refused: the lease is lost
            refused.set()
            raise

    monkeypatch.setattr(client, "touch", watched_touch)

    async def slow(job: Job) -> None:
        running.set()
        await asyncio.wait_for(refused.wait(), 30)  # runs until a touch is refused

    worker = Worker(client, "taken", slow, ttr=1.0, poll_timeout=0.2, concurrency=1)
    serving = asyncio.create_task(worker.serve())
    await asyncio.wait_for(running.wait(), 10)
    assert await client.release("taken", jid) == "ready"  # no lease: lmstfy's release
    other = await client.consume("taken", ttr=60, timeout=5)
    assert other is not None and other.id == jid
    until = time.monotonic() + 30
    while worker.counts["lost"] == 0:
        assert not serving.done() and time.monotonic() < until, worker.counts
        await asyncio.sleep(0.05)
    await worker.stop()
    await serving
    assert worker.counts["acked"] == 0
    job = await client.get_job("taken", jid)  # still the other consumer's
    assert job is not None and (job.state, job.deliveries) == ("reserved", 2)
    await client.ack("taken", jid, lease=other.lease)


# -- outcomes -----------------------------------------------------------------------------


async def test_each_outcome_leaves_the_job_as_said(client: AsyncClient) -> None:
    backoff = Backoff("fixed", 60.0)  # a released job waits: the worker does not take it again
    behaviours = ["ok", "result", "retry", "snooze", "bury", "plain", "bury_on", "long"]
    ids = {b: await client.publish("out", b, tries=3, backoff=backoff) for b in behaviours}

    def handle(job: Job) -> Any:  # sync: runs in the worker's threads
        kind = job.text
        if kind == "result":
            return {"total": 42}
        if kind == "retry":
            raise Retry(delay=30, error="upstream busy")
        if kind == "snooze":
            raise Snooze(45)
        if kind == "bury":
            raise Bury("card expired")
        if kind == "plain":
            raise KeyError("no such order")
        if kind == "bury_on":
            raise ValueError("malformed")
        if kind == "long":
            raise RuntimeError("é" * 2000)
        return None

    registry = CollectorRegistry()
    worker = Worker(
        client, "out", handle, bury_on=(ValueError,), poll_timeout=0.2, metrics=registry
    )
    await run_until(worker, lambda: sum(worker.counts.values()) >= len(behaviours))
    for outcome, n in worker.counts.items():
        if outcome == "time_limited":  # (a count of its own, beside the outcomes)
            continue
        labels = {"queue": "out", "outcome": outcome}
        assert (registry.get_sample_value("cluster_dq_worker_jobs_total", labels) or 0) == n
    ran = registry.get_sample_value("cluster_dq_worker_handler_seconds_count", {"queue": "out"})
    assert ran == len(behaviours)
    assert registry.get_sample_value("cluster_dq_worker_in_flight") == 0
    assert worker.counts == {
        "acked": 2,
        "released": 3,
        "snoozed": 1,
        "buried": 2,
        "lost": 0,
        "failed": 0,
        "time_limited": 0,
    }
    got = {b: await client.get_job("out", i) for b, i in ids.items()}

    def view(j: Job | None) -> tuple[Any, ...] | None:
        if j is None or j.state == "acked":
            return None if j is None else ("acked", j.result)
        return (j.state, j.remain_tries, j.deliveries, j.last_error, j.reason)

    assert view(got["ok"]) is None
    assert view(got["result"]) in (None, ("acked", {"total": 42}))
    assert view(got["retry"]) == ("delayed", 2, 1, "upstream busy", None)
    assert view(got["snooze"]) == ("delayed", 3, 0, None, None)
    assert view(got["bury"]) == ("dead", 2, 1, "card expired", "buried")
    assert view(got["plain"]) == ("delayed", 2, 1, "KeyError: 'no such order'", None)
    assert view(got["bury_on"]) == ("dead", 2, 1, "ValueError: malformed", "buried")
    long = got["long"]
    assert long is not None and long.last_error is not None
    assert long.last_error.startswith("RuntimeError: éé")
    assert len(long.last_error.encode()) <= MAX_TEXT


# -- concurrency --------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "consumers"), [("async", 1), ("sync", 1), ("async", 3)])
async def test_never_more_handlers_at_once_than_the_concurrency(
    solo: AsyncClient, kind: str, consumers: int
) -> None:
    """Topology-insensitive (the limit is the worker's own): standalone only. With several
    consumes in flight, the slots each one asks for count as taken."""
    client = solo
    await client.publish_many("conc", ["1"] * 40)
    now, peak, lock = 0, 0, threading.Lock()

    def enter() -> None:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)

    def leave() -> None:
        nonlocal now
        with lock:
            now -= 1

    async def ahandle(job: Job) -> None:
        enter()
        await asyncio.sleep(0.03)
        leave()

    def shandle(job: Job) -> None:
        enter()
        time.sleep(0.03)
        leave()

    handler = ahandle if kind == "async" else shandle
    worker = Worker(client, "conc", handler, concurrency=3, consumers=consumers, poll_timeout=0.2)
    await run_until(worker, lambda: worker.counts["acked"] >= 40)
    assert peak == 3 and worker.counts["acked"] == 40
    assert len(worker._held) == 0 and worker._asked == 0
    assert (await client.size("conc")).total == 0


# -- the iterator form --------------------------------------------------------------------


async def test_the_iterator_form_settles_each_job_as_told(solo: AsyncClient) -> None:
    """Topology-insensitive (the same requests as the handler form): standalone only."""
    client = solo
    backoff = Backoff("fixed", 60.0)
    kinds = ["ack", "release", "snooze", "bury", "block-ok", "block-raise", "block-snooze"]
    ids = {k: await client.publish("it", k, tries=3, backoff=backoff) for k in kinds}
    confirmed = []
    seen: set[str] = set()
    async with Worker(client, "it", poll_timeout=0.2, concurrency=4) as worker:
        async for job in worker:
            kind = job.text
            seen.add(kind)
            if kind == "ack":
                with pytest.raises(ValueError, match="not JSON"):
                    await worker.ack(job, {1, 2})  # refused: the job is still to settle
                confirmed.append(await worker.ack(job, wait=True))
            elif kind == "release":
                await worker.release(job, delay=30, error="later")
            elif kind == "snooze":
                await worker.snooze(job, 30)
            elif kind == "bury":
                await worker.bury(job, "hopeless")
            else:
                async with worker.settle(job):
                    if kind == "block-raise":
                        raise KeyError("missing")
                    if kind == "block-snooze":
                        raise Snooze(30)
            # every kind settled by the body (each awaited above): the counts, updated as
            # settles end, could reach 6 before the 7th job was handed out (it then went
            # back to ready unseen as the worker stopped: seen once under load)
            if len(seen) == len(kinds):
                break
    assert confirmed == ["acked"]
    states = {k: await client.get_job("it", i) for k, i in ids.items()}
    view = {
        k: j and (j.state, j.remain_tries, j.deliveries, j.last_error) for k, j in states.items()
    }
    assert view == {
        "ack": None,
        "release": ("delayed", 2, 1, "later"),
        "snooze": ("delayed", 3, 0, None),
        "bury": ("dead", 2, 1, "hopeless"),
        "block-ok": None,
        "block-raise": ("delayed", 2, 1, "KeyError: 'missing'"),
        "block-snooze": ("delayed", 3, 0, None),
    }
    assert (await client.size("it")).reserved == 0


# -- the test mode ------------------------------------------------------------------------

BEHAVIOURS = st.one_of(
    st.tuples(st.just("return"), st.one_of(st.none(), st.integers(), st.text(max_size=20))),
    st.tuples(st.just("return-set"), st.just(None)),
    st.tuples(st.just("return-huge"), st.just(None)),
    st.tuples(st.just("retry"), st.one_of(st.none(), st.integers(30, 600))),
    st.tuples(st.just("retry-error"), st.text(max_size=1500)),
    st.tuples(st.just("snooze"), st.integers(30, 600)),
    st.tuples(st.just("bury"), st.text(min_size=1, max_size=1500)),
    st.tuples(st.just("raise-value"), st.text(max_size=1500)),
    st.tuples(st.just("raise-key"), st.text(max_size=50)),
    st.tuples(st.just("raise-generator-exit"), st.text(max_size=50)),
    st.tuples(st.just("raise-base"), st.text(max_size=50)),
)


class Abort(BaseException):
    """An exception of a handler's own outside ``Exception``."""


def behave(job: Job) -> Any:
    """What the job's body says to do (the same code runs in the worker and in run_job)."""
    kind, arg = json.loads(job.body)
    if kind == "return":
        return arg
    if kind == "return-set":
        return {1, 2}
    if kind == "return-huge":
        return "x" * 5000
    if kind == "retry":
        raise Retry(delay=arg)
    if kind == "retry-error":
        raise Retry(delay=60, error=arg)
    if kind == "snooze":
        raise Snooze(arg)
    if kind == "bury":
        raise Bury(arg)
    if kind == "raise-value":
        raise ValueError(arg)
    if kind == "raise-generator-exit":
        raise GeneratorExit(arg)
    if kind == "raise-base":
        raise Abort(arg)
    raise KeyError(arg)


def expected(outcome: Outcome) -> tuple[Any, ...] | None:
    """What the service shows of a job (tries=3, a fixed 60-s backoff) after ``outcome``."""
    if isinstance(outcome, Acked):
        return None
    if isinstance(outcome, Released):
        return ("delayed", 2, 1, outcome.error or None, None)
    if isinstance(outcome, Snoozed):
        return ("delayed", 3, 0, outcome.error, None)
    return ("dead", 2, 1, outcome.reason, "buried")


@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(BEHAVIOURS, min_size=1, max_size=10), st.booleans(), st.booleans())
async def test_the_test_mode_decides_as_the_real_worker(
    solo: AsyncClient, behaviours: list[tuple[str, Any]], sync: bool, results: bool
) -> None:
    """For handlers that return or raise at random, ``run_job`` gives the outcome whose
    effect the real worker leaves on the service. Topology-insensitive (the decision is the
    worker's): standalone only."""
    client = solo
    await client.destroy("tm")
    backoff = Backoff("fixed", 60.0)
    bodies = [json.dumps(b) for b in behaviours]
    ids = [await client.publish("tm", b, tries=3, backoff=backoff) for b in bodies]

    async def ahandler(job: Job) -> Any:
        return behave(job)

    handler: Any = behave if sync else ahandler
    worker = Worker(client, "tm", handler, bury_on=(ValueError,), results=results, poll_timeout=0.1)
    await run_until(worker, lambda: sum(worker.counts.values()) >= len(ids))
    for body, jid in zip(bodies, ids, strict=True):
        outcome = await arun_job(handler, body.encode(), bury_on=(ValueError,), results=results)
        job = await client.get_job("tm", jid)
        seen = None
        if job is not None and job.state != "acked":
            seen = (job.state, job.remain_tries, job.deliveries, job.last_error, job.reason)
        assert seen == expected(outcome), (body, outcome)
        if isinstance(outcome, Acked) and job is not None:
            assert job.result == outcome.result


async def test_a_refused_token_stops_the_worker_with_its_error(
    solo_service: tuple[str, str], solo: AsyncClient
) -> None:
    """Topology-insensitive (the token check is the service's, before any Redis work):
    standalone only. Bad settings are refused when the worker is made."""
    async with AsyncClient(solo_service[0], "01NOSUCHTOKEN0000000000000", NS) as client:
        worker = Worker(client, "q", lambda job: None, poll_timeout=0.1)
        with pytest.raises(Unauthorized):
            await asyncio.wait_for(worker.serve(), 30)
        for bad in ({"concurrency": 0}, {"batch": 101}, {"ttr": 0}, {"ack_batch": 1001}):
            with pytest.raises(ValueError):
                Worker(client, "q", lambda job: None, **bad)
        with pytest.raises(ValueError, match="queues"):
            Worker(client, [], lambda job: None)
    with pytest.raises(BadRequest, match="queue"):  # a name the service refuses
        await asyncio.wait_for(Worker(solo, "_hidden", lambda job: None).serve(), 30)


# -- the rule itself ----------------------------------------------------------------------


def test_decide_maps_returns_and_exceptions_onto_outcomes() -> None:
    assert decide(None) == Acked() and decide({"a": 1}) == Acked({"a": 1})
    # as the service measures and reads a result: UTF-8, not escaped; a lone surrogate is none
    assert decide("\u00e9" * 2000) == Acked("\u00e9" * 2000)
    assert isinstance(decide("a\udcff"), Released)

    assert decide(exc=Retry()) == Released(None, None)
    assert decide(exc=Retry(5, "busy")) == Released(5.0, "busy")
    assert decide(exc=Snooze(7)) == Snoozed(7.0)
    assert decide(exc=Bury("no")) == Buried("no")
    assert decide(exc=ValueError("v"), bury_on=(ValueError,)) == Buried("ValueError: v")
    assert decide(exc=ValueError("v")) == Released(None, "ValueError: v")
    assert decide(exc=KeyError()) == Released(None, "KeyError")
    assert decide(exc=GeneratorExit()) == Released(None, "GeneratorExit")
    assert decide(exc=Abort("x"), bury_on=(Abort,)) == Buried("Abort: x")
    assert isinstance(decide({1}), Released) and isinstance(decide(float("nan")), Released)
    with pytest.raises(ValueError, match="delay"):
        Snooze(-1)
    with pytest.raises(ValueError, match="delay"):
        Retry(float("nan"))
    assert clip("é" * 600) == "é" * 512 and len(clip("ab" * 600).encode()) == MAX_TEXT
    assert run_job(lambda job: job.json()["n"] + 1, {"n": 1}) == Acked(2)
    assert run_job(lambda job: {1}, results=False) == Acked()


def test_the_worker_and_its_test_mode_import_nothing_of_the_service() -> None:
    """A worker needs the client only; prometheus_client only when metrics are asked for.
    ``cluster_dq.names`` and ``cluster_dq.envvars`` (the name rules and the names of the
    client's variables, importing nothing) and ``cluster_dq.tracing`` (the spans, importing
    opentelemetry when it is installed) are shared by both sides on purpose."""
    code = (
        "import sys; from cluster_dq.client import Worker; import cluster_dq.client.testing; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('redis', 'starlette', 'uvicorn', 'prometheus_client') "
        "or (m.startswith('cluster_dq.') and not m.startswith('cluster_dq.client') "
        "and m not in ('cluster_dq.names', 'cluster_dq.envvars', 'cluster_dq.tracing'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr


@pytest.mark.parametrize("module", ["cluster_dq.client.worker", "cluster_dq.client"])
def test_the_worker_command_starts_under_both_names(module: str) -> None:
    """``python -m cluster_dq.client.worker`` and ``python -m cluster_dq.client`` are the same
    command: a missing handler is said in one line, status 1 (runpy warns of nothing)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-W", "error", "-m", module, "no_such_module:f", "--queue", "q"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip() == "'no_such_module:f': No module named 'no_such_module'"


# -- time limits --------------------------------------------------------------------------


async def test_a_handler_past_its_time_limit_is_stopped_and_its_slot_freed(
    solo: AsyncClient,
) -> None:
    """arq's ``job_timeout``, dramatiq's ``TimeLimit``: an async handler is cancelled at the
    limit, a sync one abandoned in its thread (it cannot be stopped); either way the job is
    released with an error naming the limit, a try spent, and with one slot the next job runs
    at once, while the abandoned thread still runs. A job may ask for less than the worker's
    limit, never more; a limit that is not seconds > 0 is ignored."""
    client = solo
    backoff = Backoff("fixed", 60.0)  # a released job waits: not taken again here
    release = threading.Event()
    ran: dict[str, float] = {}

    def stuck_sync(job: Job) -> str:
        if job.text == "stuck":
            release.wait(30)  # far past the limit
            return "too late"
        return "ok"

    async def stuck_async(job: Job) -> str:
        if job.text == "stuck":
            started = time.monotonic()
            try:
                await asyncio.sleep(30)
            finally:
                ran[job.id] = time.monotonic() - started
        return "ok"

    for handler, q in ((stuck_sync, "limit-sync"), (stuck_async, "limit-async")):
        stuck = await client.publish(q, b"stuck", tries=3, backoff=backoff)
        quick = await client.publish(q, b"quick", tries=3)
        registry = CollectorRegistry()
        worker = Worker(
            client, q, handler, time_limit=1.0, concurrency=1, poll_timeout=0.2, metrics=registry
        )
        await run_until(worker, lambda: worker.counts["acked"] >= 1, timeout=20)
        assert worker.counts["time_limited"] == 1 and worker.counts["released"] == 1
        labels = {"queue": q}
        assert registry.get_sample_value("cluster_dq_worker_time_limited_total", labels) == 1
        job = await client.get_job(q, stuck)
        assert job is not None and (job.state, job.remain_tries, job.deliveries) == (
            "delayed",
            2,
            1,
        )
        assert job.last_error == (
            "TimeLimitExceeded: the handler ran past the job's time limit of 1 s"
        )
        done = await client.get_job(q, quick)
        assert done is None or done.state == "acked"
    assert 0.9 <= ran[stuck] < 5  # cancelled at its limit (stuck: the async queue's)
    release.set()  # the abandoned thread ends; its "too late" is never sent

    # a job's own limit: at most the worker's; junk is ignored (the worker's applies)
    asked = {"less": "0.5", "more": "20", "junk": "soon"}
    ids = {
        k: await client.publish(
            "limit-own", k, tries=2, backoff=backoff, attributes={"time_limit": v}
        )
        for k, v in asked.items()
    }
    began: dict[str, float] = {}
    took: dict[str, float] = {}

    async def sleeper(job: Job) -> None:
        began[job.text] = time.monotonic()
        try:
            await asyncio.sleep(30)
        finally:
            took[job.text] = time.monotonic() - began[job.text]

    worker = Worker(client, "limit-own", sleeper, time_limit=2.0, concurrency=3, poll_timeout=0.2)
    await run_until(worker, lambda: worker.counts["time_limited"] >= 3, timeout=20)
    assert 0.4 <= took["less"] < 1.5, took
    assert 1.9 <= took["more"] < 3.5 and 1.9 <= took["junk"] < 3.5, took
    for k, jid in ids.items():
        job = await client.get_job("limit-own", jid)
        assert job is not None and job.state == "delayed", k
        limit = "0.5" if k == "less" else "2"
        assert (
            job.last_error
            == f"TimeLimitExceeded: the handler ran past the job's time limit of {limit} s"
        )


def test_an_abandoned_call_frees_its_thread_slot_and_its_thread_ends() -> None:
    """The executor of sync handlers: a call abandoned at its time limit no longer counts, so
    a pool of one thread runs the next call at once; when the abandoned call returns, its
    thread ends and the pool is back to one thread."""
    from cluster_dq.client._runner import DaemonThreads

    pool = DaemonThreads(1, "t")
    gate = threading.Event()
    stuck = pool.submit(gate.wait, 30)
    wait_for(lambda: stuck.running())
    pool.abandon(stuck)
    assert pool.abandoned() == 1
    assert pool.submit(lambda: "next").result(timeout=5) == "next"  # a second thread ran it
    gate.set()
    assert stuck.result(timeout=5) is True
    wait_for(lambda: pool.abandoned() == 0 and len(pool._threads) == 1)
    assert pool.submit(lambda: "again").result(timeout=5) == "again"
    gate.clear()
    busy = pool.submit(gate.wait, 30)
    wait_for(lambda: busy.running())
    queued = pool.submit(lambda: "never")
    pool.abandon(queued)  # not started yet: cancelled, it never runs
    assert queued.cancelled() and pool.abandoned() == 0
    gate.set()
    assert busy.result(timeout=5) is True
    pool.shutdown()


# -- middleware and hooks -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_middleware_wraps_every_handler_call_and_hooks_bracket_the_run(
    solo: AsyncClient, kind: str
) -> None:
    """dramatiq's middleware, arq's on_startup / on_shutdown: each middleware runs around the
    handler (the first outermost), sees its result or its exception and may change either;
    one raising before the handler runs fails the job without calling it. on_startup runs
    once before the first job, on_shutdown once after the last one is settled."""
    client, q = solo, f"mw-{kind}"
    backoff = Backoff("fixed", 60.0)
    ids = {b: await client.publish(q, b, tries=3, backoff=backoff) for b in ("ok", "boom", "deny")}
    events: list[str] = []

    async def outer(job: Job, call_next: Any) -> Any:
        events.append(f"outer before {job.text}")
        if job.text == "deny":
            raise PermissionError("not this one")
        try:
            result = await call_next(job)
        except KeyError as e:  # what a handler failed with, turned into a retry in 30 s
            events.append(f"outer error {job.text}")
            raise Retry(delay=30, error=f"upstream: {e}") from e
        events.append(f"outer after {job.text}")
        return {"wrapped": result}

    async def inner(job: Job, call_next: Any) -> Any:
        events.append(f"inner before {job.text}")
        try:
            return await call_next(job)
        finally:
            events.append(f"inner after {job.text}")

    def work(job: Job) -> Any:
        assert started == ["up"], "on_startup runs before the first job"
        events.append(f"handler {job.text}")
        if job.text == "boom":
            raise KeyError("gone")
        return job.text

    async def awork(job: Job) -> Any:
        return work(job)

    started: list[str] = []
    stopped: list[dict[str, int]] = []

    async def up(worker: Worker) -> None:
        started.append("up")

    def down(worker: Worker) -> None:  # a plain function works too
        stopped.append(dict(worker.counts))

    worker = Worker(
        client,
        q,
        awork if kind == "async" else work,
        middleware=[outer, inner],
        on_startup=up,
        on_shutdown=down,
        concurrency=1,
        poll_timeout=0.2,
    )
    await run_until(worker, lambda: sum(worker.counts.values()) >= 3)
    assert started == ["up"] and len(stopped) == 1
    assert stopped[0]["acked"] == 1 and stopped[0]["released"] == 2
    ok = [e for e in events if e.endswith(" ok")]
    assert ok == [
        "outer before ok",
        "inner before ok",
        "handler ok",
        "inner after ok",
        "outer after ok",
    ]
    boom = [e for e in events if e.endswith(" boom")]
    assert boom == [
        "outer before boom",
        "inner before boom",
        "handler boom",
        "inner after boom",
        "outer error boom",
    ]
    assert [e for e in events if e.endswith(" deny")] == ["outer before deny"]  # never called
    done = await client.get_job(q, ids["ok"])
    assert done is None or (done.state, done.result) == ("acked", {"wrapped": "ok"})
    boomed = await client.get_job(q, ids["boom"])
    assert boomed is not None and (boomed.state, boomed.last_error) == (
        "delayed",
        "upstream: 'gone'",
    )
    denied = await client.get_job(q, ids["deny"])
    assert denied is not None
    assert (denied.state, denied.last_error) == ("delayed", "PermissionError: not this one")


async def test_a_failing_on_startup_keeps_the_worker_from_consuming(solo: AsyncClient) -> None:
    jid = await solo.publish("mw-startup", b"x")

    def up(worker: Worker) -> None:
        raise RuntimeError("no database")

    down: list[Worker] = []
    worker = Worker(
        solo,
        "mw-startup",
        lambda job: None,
        on_startup=up,
        on_shutdown=down.append,
        poll_timeout=0.2,
    )
    with pytest.raises(RuntimeError, match="no database"):
        await worker.serve()
    await worker.stop()
    assert down == []  # it never started: nothing to shut down
    job = await solo.get_job("mw-startup", jid)
    assert job is not None and (job.state, job.deliveries) == ("ready", 0)


def test_the_command_line_names_middleware_and_hooks() -> None:
    from cluster_dq.client._worker_cli import parser, worker_options

    args = parser().parse_args(
        ["json:dumps", "-q", "a", "--middleware", "json:loads", "--middleware", "os.path:join"]
        + ["--on-startup", "os:getcwd", "--time-limit", "2.5"]
    )
    options = worker_options(args)
    assert options["handler"] is json.dumps and options["on_startup"] is os.getcwd
    assert options["middleware"] == [json.loads, os.path.join]  # outermost first
    assert options["on_shutdown"] is None and options["time_limit"] == 2.5


def test_the_test_mode_applies_time_limits_and_middleware_as_the_worker() -> None:
    """``run_job`` decides with the worker's own code for time limits and middleware."""

    def stuck(job: Job) -> None:
        time.sleep(3)

    async def astuck(job: Job) -> None:
        await asyncio.sleep(3)

    for handler in (stuck, astuck):
        assert run_job(handler, b"x", time_limit=0.2) == Released(
            None, "TimeLimitExceeded: the handler ran past the job's time limit of 0.2 s"
        )
        own = run_job(handler, b"x", time_limit=5, attributes={"time_limit": "0.1"})
        assert own == Released(
            None, "TimeLimitExceeded: the handler ran past the job's time limit of 0.1 s"
        )

    async def retry_on_key_error(job: Job, call_next: Any) -> Any:
        try:
            return {"seen": await call_next(job)}
        except KeyError as e:
            raise Retry(delay=30, error=f"upstream: {e}") from e

    def work(job: Job) -> Any:
        if job.text == "boom":
            raise KeyError("gone")
        return job.text

    assert run_job(work, "ok", middleware=[retry_on_key_error]) == Acked({"seen": "ok"})
    assert run_job(work, "boom", middleware=[retry_on_key_error]) == Released(
        30.0, "upstream: 'gone'"
    )


# -- who is running what ------------------------------------------------------------------


async def test_a_running_worker_is_listed_with_the_jobs_it_holds_until_it_stops(
    client: AsyncClient,
) -> None:
    """Each worker announces itself (host, pid, queues, concurrency, version, started) and the
    jobs it holds with their start times; when it stops it is no longer listed."""
    jid = await client.publish("who", b"x", tries=1)
    holding, release = asyncio.Event(), asyncio.Event()

    async def slow(job: Job) -> None:
        holding.set()
        await asyncio.wait_for(release.wait(), 30)

    worker = Worker(client, ["who", "who-else"], slow, concurrency=3, poll_timeout=0.2)
    serving = asyncio.create_task(worker.serve())
    await asyncio.wait_for(holding.wait(), 10)
    mine: list[Any] = []
    until = time.monotonic() + 30
    while not mine or not mine[0].in_flight:  # the next announcement lists the held job
        assert time.monotonic() < until, mine
        await asyncio.sleep(0.2)
        # (announced every 10 s: the first one came before the job was held)
        mine = [w for w in (await client.workers()).workers if w.worker_id == worker.announcer.id]
    (me,) = mine
    assert (me.pid, me.queues, me.concurrency) == (os.getpid(), ("who", "who-else"), 3)
    assert me.host and me.version and me.started_at and me.expires_at > time.time()
    (held,) = me.in_flight
    assert (held.queue, held.job_id) == ("who", jid)
    assert held.started_at is not None and abs(held.started_at - time.time()) < 30
    release.set()
    await worker.stop()
    await serving
    assert worker.announcer.id not in [w.worker_id for w in (await client.workers()).workers]


def test_the_thread_pool_never_runs_a_call_it_could_not_start_a_thread_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread the OS refuses: the submit raises and its call is not left queued (the next
    thread would have run it for a job already released); abandoned calls are bounded by
    the pool's size, past which one keeps its place."""
    from cluster_dq.client._runner import DaemonThreads

    pool = DaemonThreads(1, "t")
    start = threading.Thread.start

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    ran: list[str] = []
    with pytest.raises(RuntimeError):
        pool.submit(ran.append, "stale")
    monkeypatch.setattr(threading.Thread, "start", start)
    assert pool.submit(ran.append, "fresh").result(timeout=5) is None
    assert ran == ["fresh"]
    gate = threading.Event()
    first = pool.submit(gate.wait, 30)
    wait_for(lambda: first.running())
    assert pool.abandon(first) and pool.abandoned() == 1
    second = pool.submit(gate.wait, 30)
    wait_for(lambda: second.running())
    assert not pool.abandon(second) and pool.abandoned() == 1  # at most size (1) at once
    gate.set()
    pool.shutdown()


async def test_a_time_limit_counts_from_when_the_handler_starts_not_while_it_waits() -> None:
    """A sync handler's call waits for a thread when all are busy: its time limit counted from
    its submission, so a quick job queued behind a slow one was killed without ever running
    (TimeLimitExceeded, a try spent). It counts from the start; a handler that then overruns
    is still stopped."""
    from cluster_dq.client._call import call_handler
    from cluster_dq.client._runner import DaemonThreads
    from cluster_dq.client.testing import make_job

    ran: list[bytes] = []

    def handler(job: Job) -> str:
        ran.append(job.body)
        time.sleep(float(job.body.decode().split(":")[1]))
        return job.body.decode()

    pool = DaemonThreads(1, "t")
    try:
        slow = call_handler(handler, make_job(b"slow:0.5"), pool, 2.0)
        quick = call_handler(handler, make_job(b"quick:0"), pool, 0.2)  # waits ~0.5 s
        assert await asyncio.gather(slow, quick) == ["slow:0.5", "quick:0"]
        with pytest.raises(TimeLimitExceeded):
            await call_handler(handler, make_job(b"over:0.6"), pool, 0.2)
    finally:
        pool.shutdown(wait=False)
    assert ran == [b"slow:0.5", b"quick:0", b"over:0.6"]


async def test_a_call_no_thread_begins_within_its_limit_goes_back_not_waits_for_ever() -> None:
    """Its limit counts from its start, but a call no thread begins (every one held by a
    handler past its limit) waited for ever, its job held by heartbeats: at its limit it is
    cancelled (NotStarted, which the worker gives back unspent) and never runs."""
    from cluster_dq.client._call import call_handler
    from cluster_dq.client._runner import DaemonThreads, NotStarted
    from cluster_dq.client.testing import make_job

    ran: list[bytes] = []

    def handler(job: Job) -> None:
        ran.append(job.body)
        time.sleep(float(job.body.decode().split(":")[1]))

    pool = DaemonThreads(1, "t")
    try:
        for body in (b"hung:4", b"hung:4"):  # the first left to its thread, the second kept
            with pytest.raises(TimeLimitExceeded):
                await call_handler(handler, make_job(body), pool, 0.1)
        with pytest.raises(NotStarted):
            await asyncio.wait_for(call_handler(handler, make_job(b"late:0"), pool, 0.2), 2)
    finally:
        pool.shutdown(wait=False)
    assert ran == [b"hung:4", b"hung:4"]  # the cancelled call never ran


def test_what_a_worker_cannot_use_is_refused_when_it_is_made_and_an_outcome_never_raises() -> None:
    """A result whose encoding raised something but TypeError or ValueError, and a ``bury_on``
    entry that is no exception class, raised out of the job's task: the job stayed reserved,
    heartbeats renewing it, its slot lost, nothing logged. A handler that is no function was
    taken and failed on every job. A ``--metrics-port`` taken ended in a traceback."""

    class Broken(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise RuntimeError("no items")

    out = decide(Broken(a=1))
    assert isinstance(out, Released) and "RuntimeError: no items" in (out.error or ""), out
    client = AsyncClient("http://127.0.0.1:1", "t", "n")
    with pytest.raises(ValueError, match="bury_on"):
        Worker(client, "q", bury_on=("ValueError",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="callable"):
        Worker(client, "q", "not a function")  # type: ignore[arg-type]
    from cluster_dq.client.worker import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit, match=f"--metrics-port {port}"):
            main(["h:f", "-q", "q", "--metrics-port", str(port)])


def test_a_jobs_time_limit_attribute_is_plain_seconds() -> None:
    from cluster_dq.client._call import job_limit
    from cluster_dq.client.testing import make_job

    def limit(raw: str, worker: float | None = None) -> float | None:
        return job_limit(make_job(b"", attributes={"time_limit": raw}), worker)

    assert (limit("30"), limit("0.5"), limit("2", 1.0), limit("1.25", 60)) == (30, 0.5, 1.0, 1.25)
    for junk in ("0", "0.000", "1_0", "1e-300", "nan", "inf", "-1", "0x1", " 2", "1.2345"):
        assert limit(junk, 7.0) == 7.0, junk  # ignored: the worker's applies
    with pytest.raises(ValueError, match="middleware"):
        Worker(AsyncClient("http://127.0.0.1:1", "t", "n"), "q", middleware=[lambda j, n: n(j)])


def test_an_announcement_stays_within_what_the_service_takes() -> None:
    """However many queues a worker lists or jobs it holds, its announcement is one the
    service accepts (``cluster_dq.workers.parse_announcement``, the service's own check)."""
    from cluster_dq.client._announce import Announcer
    from cluster_dq.client._iterform import Delivery
    from cluster_dq.client.testing import make_job
    from cluster_dq.workers import parse_announcement

    held = [Delivery(make_job(b"", queue="q", job_id=f"j{i}"), 0.0, 60.0) for i in range(1_500)]
    queues = [f"q{i}" for i in range(150)]
    info = Announcer(None, queues, 100_000, lambda: held).info()  # type: ignore[arg-type]
    checked = parse_announcement(json.loads(json.dumps(info)))
    assert len(checked["queues"]) == 100 and len(checked["in_flight"]) == 1_000


async def test_the_announcer_outlives_a_service_that_fails_or_refuses(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unreachable, refusing (404, as a service without the registry answers), or failing
    in a way of its own: the announcer says so once until it gets through, keeps asking, and
    announces again as soon as the service takes it."""
    from cluster_dq.client import _announce
    from cluster_dq.client.errors import TransportError

    monkeypatch.setattr(_announce, "EVERY", 0.01)
    monkeypatch.setattr(_announce, "RETRY_REFUSED", 0.02)
    answers: list[BaseException | None] = [
        TransportError("connection refused", sent=False),
        TransportError("connection refused", sent=False),
        NotFound(404, "api not found"),
        RuntimeError("a bug of its own"),
        None,
        None,
    ]
    sent: list[str] = []

    class Service:
        async def announce_worker(self, worker_id: str, info: Any, *, ttl: float) -> float:
            answer = answers.pop(0) if answers else None
            if answer is not None:
                raise answer
            sent.append(worker_id)
            return 0.0

    announcer = _announce.Announcer(Service(), ["q"], 1, lambda: [])  # type: ignore[arg-type]
    task = asyncio.create_task(announcer.run())
    until = time.monotonic() + 10
    while len(sent) < 2:
        assert time.monotonic() < until and not task.done(), (sent, answers)
        await asyncio.sleep(0.01)
    task.cancel()
    warned = [r.getMessage() for r in caplog.records if "not announced" in r.getMessage()]
    assert len(warned) == 1, warned  # once, until an announcement went through
