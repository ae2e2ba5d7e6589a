# ruff: noqa: F811  (the HTTP fixtures are imported from test_worker and used as arguments)
"""Hostile handlers and careless callers against the ``Worker`` on a real service: whatever a
handler raises or does, its job is settled or given back (never left reserved by a running
worker), and a graceful stop leaves nothing reserved."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from pathlib import Path
from typing import Any

import pytest

from cluster_dq.client import AsyncClient, Backoff, Job
from cluster_dq.client.outcomes import Bury, Released, Retry, Snooze, describe
from cluster_dq.client.testing import run_job
from cluster_dq.client.worker import Worker
from tests.support.workers import NS, reaped, run_until, worker_process

EXITS = "tests.support.worker_jobs:exits_sync"


async def reserved(client: AsyncClient, q: str) -> int:
    return (await client.size(q)).reserved


async def test_a_handler_raising_cancelled_error_does_not_keep_its_job(solo: AsyncClient) -> None:
    await solo.publish("hc", "x", tries=3)
    calls: list[int] = []

    async def handle(job: Job) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise asyncio.CancelledError()  # raised by the handler, not a cancel of the worker
        return None

    worker = Worker(solo, "hc", handle, concurrency=1, poll_timeout=0.2, ttr=5)
    await run_until(worker, lambda: worker.counts["acked"] >= 1, timeout=4)
    assert await reserved(solo, "hc") == 0


async def test_a_sync_handler_raising_system_exit_gives_its_job_back_and_stops_the_worker(
    solo: AsyncClient,
) -> None:
    jid = await solo.publish("hx", "x", tries=2)

    def handle(job: Job) -> Any:
        raise SystemExit(3)

    worker = Worker(solo, "hx", handle, concurrency=2, poll_timeout=0.2, ttr=5)
    with pytest.raises(SystemExit):  # in this task: a task raising it would end the loop
        await worker.serve()
    assert await reserved(solo, "hx") == 0
    job = await solo.get_job("hx", jid)
    assert job is not None and job.state == "ready"  # given back, not released as failed


async def test_stop_called_from_inside_a_handler_returns_and_the_job_is_acked(
    solo: AsyncClient,
) -> None:
    await solo.publish("hs", "x")

    async def handle(job: Job) -> Any:
        await worker.stop()
        return None

    worker = Worker(solo, "hs", handle, poll_timeout=0.2, ttr=5, shutdown_timeout=20)
    t0 = time.monotonic()
    await asyncio.wait_for(worker.serve(), 10)
    assert time.monotonic() - t0 < 5
    assert worker.counts["acked"] == 1
    assert await reserved(solo, "hs") == 0


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def _deep(n: int) -> Any:
    value: Any = []
    for _ in range(n):
        value = [value]
    return value


async def test_outcomes_that_cannot_be_described_still_settle_the_job(solo: AsyncClient) -> None:
    """Careless handlers: a result too deep for JSON, an exception whose ``str`` raises, a Bury
    or Retry with a text that is not a string. Each job is still settled (before: the
    handler's task died deciding, the job stayed held and touched for ever and the slot with
    it, so with concurrency 1 nothing ran after the first)."""
    kinds = ["deep", "unprintable", "bury_none", "retry_bytes", "ok"]
    for kind in kinds:
        await solo.publish("hd", kind, tries=5)

    def handle(job: Job) -> Any:
        kind = job.text
        if kind == "deep":
            return _deep(100_000)
        if kind == "unprintable":
            raise _Unprintable()
        if kind == "bury_none":
            raise Bury(None)  # type: ignore[arg-type]
        if kind == "retry_bytes":
            raise Retry(30, error=b"bytes")  # type: ignore[arg-type]
        return None

    worker = Worker(solo, "hd", handle, concurrency=1, poll_timeout=0.2, ttr=5)
    await run_until(worker, lambda: sum(worker.counts.values()) >= len(kinds), timeout=5)
    assert worker.counts["acked"] == 1 and worker.counts["buried"] == 1, worker.counts
    assert worker.counts["released"] >= 3  # the ones released at once may come back
    assert await reserved(solo, "hd") == 0


def test_the_test_mode_releases_a_handler_that_raises_cancelled_error() -> None:
    """As the real worker does (before: the CancelledError went through ``run_job``)."""

    async def handle(job: Job) -> Any:
        raise asyncio.CancelledError()

    assert run_job(handle, "x") == Released(error="CancelledError")


class _Abort(BaseException):
    """A custom exception outside ``Exception`` (as some libraries define their own)."""


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_handler_raising_a_base_exception_releases_its_job_and_frees_its_slot(
    solo: AsyncClient, sync: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """``GeneratorExit`` or a class of its own deriving from ``BaseException``: the job is
    released with the error as any exception's, a line is logged, and the slot runs the next
    job (before: the handler's task died with it, no line, the job held and touched for as
    long as the worker lived, and with concurrency 1 nothing ran after it)."""
    backoff = Backoff("fixed", 60.0)  # released jobs stay delayed: their last error is seen
    gen = await solo.publish("hbase", "generator-exit", tries=2, backoff=backoff)
    own = await solo.publish("hbase", "abort", tries=2, backoff=backoff)
    ok = await solo.publish("hbase", "ok", tries=2, backoff=backoff)
    ran: list[str] = []

    def act(job: Job) -> Any:
        ran.append(job.id)
        if job.text == "generator-exit":
            raise GeneratorExit()
        if job.text == "abort":
            raise _Abort("gave up")
        return None

    async def ahandle(job: Job) -> Any:
        return act(job)

    handler: Any = act if sync else ahandle
    worker = Worker(solo, "hbase", handler, concurrency=1, poll_timeout=0.2, ttr=5)
    with caplog.at_level(logging.WARNING, logger="cluster_dq.worker"):
        await run_until(worker, lambda: sum(worker.counts.values()) >= 3, timeout=10)
    assert sorted(ran) == sorted([gen, own, ok])  # one slot: each ran after the one before
    assert worker.counts == {**worker.counts, "released": 2, "acked": 1}, worker.counts
    assert await reserved(solo, "hbase") == 0
    for jid, error in ((gen, "GeneratorExit"), (own, "_Abort: gave up")):
        job = await solo.get_job("hbase", jid)
        assert job is not None and (job.state, job.remain_tries, job.last_error) == (
            "delayed",
            1,
            error,
        )
        said = [r.getMessage() for r in caplog.records if jid in r.getMessage()]
        assert said and error in said[0], caplog.text


def test_the_test_mode_releases_a_handler_raising_a_base_exception() -> None:
    """As the real worker does (before: the exception went through ``run_job``)."""

    async def ahandle(job: Job) -> Any:
        raise GeneratorExit()

    def handle(job: Job) -> Any:
        raise _Abort("gave up")

    assert run_job(ahandle, "x") == Released(error="GeneratorExit")
    assert run_job(handle, "x") == Released(error="_Abort: gave up")


class _StrRaises(BaseException):
    """An exception whose ``__str__`` raises another, outside ``Exception`` too."""

    def __init__(self, inner: BaseException) -> None:
        super().__init__()
        self.inner = inner

    def __str__(self) -> str:
        raise self.inner


@pytest.mark.parametrize(
    "inner",
    [GeneratorExit(), KeyboardInterrupt(), SystemExit(3), _Abort("in str")],
    ids=["generator-exit", "keyboard-interrupt", "system-exit", "own"],
)
async def test_a_handler_exception_whose_str_raises_anything_releases_its_job(
    solo: AsyncClient, inner: BaseException
) -> None:
    """The handler's exception cannot be printed, whatever its ``__str__`` raises: the job is
    released as unprintable and the worker goes on (before: a ``BaseException`` from
    ``__str__`` escaped the outcome's text; ``KeyboardInterrupt``/``SystemExit`` ended the
    event loop with the job held, ``GeneratorExit`` killed the slot's task without a line)."""
    backoff = Backoff("fixed", 60.0)
    jid = await solo.publish("hstr", "x", tries=2, backoff=backoff)

    async def handle(job: Job) -> Any:
        raise _StrRaises(inner)

    worker = Worker(solo, "hstr", handle, concurrency=1, poll_timeout=0.2, ttr=5)
    await run_until(worker, lambda: worker.counts.get("released", 0) >= 1, timeout=10)
    assert await reserved(solo, "hstr") == 0
    job = await solo.get_job("hstr", jid)
    assert job is not None and (job.state, job.last_error) == (
        "delayed",
        "_StrRaises: <unprintable _StrRaises>",
    )


def test_the_test_mode_releases_a_handler_exception_whose_str_raises() -> None:
    async def handle(job: Job) -> Any:
        raise _StrRaises(KeyboardInterrupt())

    assert run_job(handle, "x") == Released(error="_StrRaises: <unprintable _StrRaises>")


class _LazyRetry(Retry):
    def __init__(self) -> None:  # never calls Retry.__init__: no delay, no error
        pass


class _LazySnooze(Snooze):
    def __init__(self) -> None:
        pass


class _LazyBury(Bury):
    def __init__(self) -> None:
        pass


class _LateSnooze(Snooze):
    def __init__(self) -> None:
        super().__init__(5)
        self.delay = "soon"  # type: ignore[assignment]  # changed after the base's checks


class _LateRetry(Retry):
    def __init__(self) -> None:
        super().__init__()
        self.delay = -3


@pytest.mark.parametrize("kind", [_LazyRetry, _LazySnooze, _LazyBury, _LateSnooze, _LateRetry])
def test_an_outcome_exception_that_skipped_its_init_is_the_handlers_error(kind: type) -> None:
    """A subclass of Retry, Snooze or Bury whose ``__init__`` does not call its base's, or
    sets a bad ``delay`` after it: the job is released with the exception as its error
    (before: ``decide`` raised AttributeError reading ``delay``/``reason``, or passed the bad
    delay on to the client, which raised: the worker's task for the job died with it, the job
    held, touched, for as long as the worker lived)."""

    async def handle(job: Job) -> Any:
        raise kind()

    assert run_job(handle, "x") == Released(error=describe(kind()))


async def test_a_worker_stopped_before_it_started_starts_nothing(solo: AsyncClient) -> None:
    """stop() before start(): a later start() or serve() returns at once and leaves no task
    running (before: the heartbeat loop started and ran for ever, nothing left to cancel it)."""
    worker = Worker(solo, "hb", lambda job: None, poll_timeout=0.2)
    await worker.stop()
    await worker.stop()  # twice: still fine
    await asyncio.wait_for(worker.serve(), 2)
    await asyncio.sleep(0.05)
    left = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("dq-worker")]
    assert left == []


async def test_a_handler_calling_sys_exit_ends_the_process_with_its_code_past_stuck_threads(
    solo_dq: tuple[str, str], solo: AsyncClient, tmp_path: Path
) -> None:
    """``python -m cluster_dq.client.worker``: a handler's ``sys.exit(3)`` stops the worker
    gracefully, every job goes back unspent, and the process exits 3 at once even while
    another handler's thread still sleeps (before: the exit waited for that thread)."""
    log = tmp_path / "log"
    slow = await solo.publish("exit", b"600", tries=1)
    await asyncio.sleep(0.05)
    bye = await solo.publish("exit", b"exit", tries=1)
    args = ["--queue", "exit", "--concurrency", "2", "--shutdown-timeout", "0.5"]
    with reaped(
        worker_process(solo_dq, log, *args, "--poll-timeout", "0.5", handler=EXITS)
    ) as proc:
        code = proc.wait(15)
    assert code == 3, log.with_suffix(".stderr").read_text()
    for jid in (slow, bye):
        job = await solo.get_job("exit", jid)
        assert job is not None and (job.state, job.remain_tries) == ("ready", 1)


async def test_a_ttr_too_short_to_renew_is_refused_and_the_shortest_one_holds(
    solo: AsyncClient,
) -> None:
    """A ttr under the heartbeat's reach is a ValueError at once (before: taken, then every
    job lost to its reservation's end while its handler ran, over and over; 0.1 s was
    accepted and lost a job on a loaded machine); the shortest one accepted keeps a job
    whose handler runs three ttrs."""
    for ttr in (0.0001, 0.01, 0.1, 0.5, 0.999):
        with pytest.raises(ValueError, match="ttr"):
            Worker(solo, "short", lambda job: None, ttr=ttr)
    await solo.publish("short", "x", tries=1)

    async def handle(job: Job) -> Any:
        await asyncio.sleep(3.0)

    worker = Worker(solo, "short", handle, ttr=1.0, poll_timeout=0.2)
    await run_until(worker, lambda: sum(worker.counts.values()) >= 1, timeout=15)
    assert worker.counts["acked"] == 1, worker.counts


def test_a_delay_the_service_would_refuse_is_the_handlers_error_at_once() -> None:
    """Retry/Snooze delays past the service's 4,294,967,295 s are a ValueError when raised
    (before: accepted up to 2**32, then a 400 on release: the outcome ``failed``, the job
    held until its ttr ran out); NaN, infinities and negatives too."""
    for bad in (4294967295.4, 2**32 - 0.001, float("nan"), float("inf"), -1, -0.001, True):
        with pytest.raises(ValueError):
            Retry(bad)
        with pytest.raises(ValueError):
            Snooze(bad)
    assert Retry(4294967295).delay == 4294967295.0 and Snooze(0).delay == 0.0


def test_settings_that_could_only_fail_later_are_a_value_error_at_once() -> None:
    """(Before: an infinite ttr or poll_timeout was taken and the first consume stopped the
    worker; a NaN or infinite ack_delay held every ack until the leases ran out, each job then
    run again.)"""
    client = AsyncClient("http://127.0.0.1:9", "t", NS)
    bad: list[dict[str, Any]] = [
        {"ttr": math.inf},
        {"ttr": math.nan},
        {"ttr": 2.0**32},
        {"poll_timeout": math.inf},
        {"poll_timeout": -1},
        {"shutdown_timeout": math.nan},
        {"ack_delay": math.nan},
        {"ack_delay": math.inf},
        {"ack_delay": -0.1},
        {"ack_delay": 30.0, "ttr": 60.0},
    ]
    for kw in bad:
        with pytest.raises((ValueError, TypeError)):
            Worker(client, "q", lambda job: None, **kw)
    Worker(client, "q", lambda job: None, ack_delay=0.0, shutdown_timeout=math.inf)
