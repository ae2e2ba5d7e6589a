"""``Worker``: runs jobs of one or more queues through an ``AsyncClient``. It owns the loop:
batch consume up to its free slots (long-poll), batch acks, heartbeats (touch) for handlers
running past half their ttr, the outcome of each job (``outcomes.decide``), and a graceful
shutdown that leaves nothing reserved. Two forms: a handler (async, or sync in a thread), or
``async for job in worker`` with ``ack`` / ``release`` / ``snooze`` / ``bury`` or a
``worker.settle(job)`` block per job. See docs/worker.md. Its command line (``main``; also
``python -m cluster_dq.client``, whose ``__main__`` runs this one):

    python -m cluster_dq.client.worker module:function --queue q [--concurrency 16] ...
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import math
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cluster_dq import tracing
from cluster_dq.client import _runner
from cluster_dq.client._acks import AckBatcher
from cluster_dq.client._announce import Announcer
from cluster_dq.client._worker_cli import parser, worker_options
from cluster_dq.client._call import Middleware, Next, call_handler, chain, job_limit, run_hook
from cluster_dq.client._iterform import GIVE_BACK, Delivery, IteratorForm
from cluster_dq.client._processes import NO_PROCESS_WAIT, Isolation, NoProcess
from cluster_dq.client._runner import NotStarted, Pool, run_loop
from cluster_dq.client._async.client import AsyncClient
from cluster_dq.client._send import renew, send_outcome
from cluster_dq.client.errors import DQError, QueueFull, RateLimited, TransportError, Unavailable
from cluster_dq.client.models import Job
from cluster_dq.client.outcomes import (
    MAX_DELAY,
    Acked,
    Bury,
    Buried,
    Outcome,
    Released,
    Retry,
    Snooze,
    Snoozed,
    TimeLimitExceeded,
    decide,
    describe,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from cluster_dq.client._wmetrics import WorkerMetrics

__all__ = ["Bury", "Retry", "Snooze", "TimeLimitExceeded", "Worker"]

log = logging.getLogger("cluster_dq.worker")
Handler = Callable[[Job], Any]
# seconds: a heartbeat renews a job at half its ttr with an HTTP round trip, which on a busy
# host takes longer than 50 ms (a 0.1-s ttr lost jobs whose handlers ran on a loaded machine)
MIN_TTR = 1.0


def _is_async(handler: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)
    )


class Worker(IteratorForm):
    """Consumes ``queues`` (listed order = priority) and runs each job through ``handler``.

    ``concurrency``: jobs held at once (handlers running or waiting); ``ttr``: each
    delivery's time to run, renewed by a touch while a handler runs past half of it;
    ``batch``: jobs per consume (1..100); ``consumers``: consumes in flight at once (more
    overlap the service's work with the handlers'); ``poll_timeout``: a consume's long-poll;
    ``bury_on``: exception classes that bury the job instead of releasing it;
    ``ack_delay`` / ``ack_batch``: acks wait at most this long, or until this many;
    ``shutdown_timeout``: how long a stop lets running handlers finish before giving their
    jobs back; ``results``: a handler's return value is the ack's result (False: ignored);
    ``time_limit``: seconds a handler may run (None: no limit); a job may ask for less with
    its attribute ``time_limit`` (seconds), never more. At the limit the handler is cancelled
    (async), abandoned in its thread (sync) or its process killed, and the job released with
    the error ``TimeLimitExceeded``; ``isolation``: ``"process"`` runs a sync handler in a
    pool of ``concurrency`` child processes, each replaced after ``max_tasks_per_child`` jobs,
    once its peak memory passed ``max_memory_per_child`` MiB, or when it dies (its job
    released with ``ChildDied``); ``middleware``: ``async def mw(job, call_next)`` each, around every
    handler call (the first outermost); ``on_startup`` / ``on_shutdown``: called with the worker
    (awaited when async) before the first consume and once the last job is settled;
    ``announce``: the worker says who it is and what it holds every 10 s (``workers()``);
    ``metrics``: True (the default registry) or a ``CollectorRegistry``."""

    def __init__(
        self,
        client: AsyncClient,
        queues: str | Sequence[str],
        handler: Handler | None = None,
        *,
        concurrency: int = 16,
        ttr: float = 60.0,
        batch: int = 100,
        consumers: int = 1,
        poll_timeout: float = 5.0,
        bury_on: tuple[type[BaseException], ...] = (),
        ack_delay: float = 0.005,
        ack_batch: int = 100,
        shutdown_timeout: float = 30.0,
        heartbeat: bool = True,
        results: bool = True,
        time_limit: float | None = None,
        isolation: str = "thread",
        max_tasks_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        middleware: Sequence[Middleware] = (),
        on_startup: Callable[[Worker], Any] | None = None,
        on_shutdown: Callable[[Worker], Any] | None = None,
        announce: bool = True,
        metrics: bool | CollectorRegistry = False,
    ) -> None:
        if not 1 <= concurrency <= 100_000:
            raise ValueError(f"concurrency must be 1..100000, not {concurrency}")
        if not 1 <= batch <= 100:
            raise ValueError(f"batch must be 1..100, not {batch}")
        if not 1 <= consumers <= 16:
            raise ValueError(f"consumers must be 1..16, not {consumers}")
        if not MIN_TTR <= ttr <= MAX_DELAY or not 0 <= poll_timeout < math.inf:
            raise ValueError(f"ttr must be {MIN_TTR}..{MAX_DELAY} s, poll_timeout finite >= 0")
        if time_limit is not None and not 0 < time_limit <= MAX_DELAY:
            raise ValueError(f"time_limit must be 0..{MAX_DELAY} s (excluding 0) or None")
        if not shutdown_timeout >= 0 or not 0 <= ack_delay <= ttr / 4:
            # an ack held longer could reach the service after the lease ran out (lost)
            raise ValueError("shutdown_timeout must be >= 0, ack_delay 0..ttr/4")
        self.client, self.queues = client, [queues] if isinstance(queues, str) else list(queues)
        if not self.queues:
            raise ValueError("queues is empty: give at least one queue")
        self.concurrency, self.ttr, self.batch = concurrency, ttr, batch
        self.consumers = consumers
        self.poll_timeout, self.bury_on = poll_timeout, tuple(bury_on)
        self.shutdown_timeout, self.heartbeat = shutdown_timeout, heartbeat
        self.results, self.time_limit = results, time_limit
        self.isolation = Isolation(
            isolation, max_tasks_per_child, max_memory_per_child, concurrency
        )
        if not all(_is_async(mw) for mw in middleware):
            raise ValueError("middleware: async def mw(job, call_next) each")
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in self.bury_on):
            raise ValueError(f"bury_on: exception classes, not {self.bury_on!r}")
        self.middleware = list(middleware)
        self.on_startup, self.on_shutdown = on_startup, on_shutdown
        self._started = False  # on_startup went through: on_shutdown is owed
        self._chained: Next | None = None  # the handler inside the middleware (start)
        self.announcer = Announcer(client, self.queues, concurrency, lambda: self._held)
        self._announce = announce
        self._handler: Handler | None = None
        self._async = True
        if handler is not None:
            self.handler(handler)
        self._metrics: WorkerMetrics | None = None
        if metrics is not False:  # prometheus_client is imported only then
            from cluster_dq.client._wmetrics import metrics_for

            self._metrics = metrics_for(None if metrics is True else metrics)
        self._acks = AckBatcher(client, self._report, ack_delay, ack_batch)
        self._backlog = max(1000, 10 * ack_batch)  # unconfirmed acks before consuming pauses
        self._held: set[Delivery] = set()
        self._ready: deque[Delivery] = deque()  # iterator form: consumed, not yet yielded
        self._yielded: dict[str, Delivery] = {}  # iterator form: given out, not settled
        self._room = asyncio.Event()
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._fetchers: list[asyncio.Task[None]] = []
        self._asked = 0  # slots promised to the consumes in flight
        self._executor: Pool | None = None
        self._stopping = asyncio.Event()
        self._forced = asyncio.Event()
        self._closing: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        self.counts: dict[str, int] = dict.fromkeys(
            ("acked", "released", "snoozed", "buried", "lost", "failed", "time_limited"), 0
        )

    def handler(self, fn: Handler) -> Handler:
        """Sets the handler (usable as a decorator): ``async def`` runs on the loop, a plain
        function in a thread. Returns ``fn`` unchanged."""
        if not callable(fn):
            raise ValueError(f"the handler must be callable, not {type(fn).__name__}")
        self._handler, self._async = fn, _is_async(fn)
        return fn

    # -- running --------------------------------------------------------------------------

    async def start(self) -> None:
        """Starts consuming (the handler form, or the iterator's background work); a worker
        that was stopped stays stopped."""
        if self._tasks or self._closing is not None:
            return
        if self._handler is not None:
            handler = self._handler
            # (a process pool's first child loads the handler: not on the event loop)
            self._executor = await asyncio.to_thread(self.isolation.pool, handler, self._async)
            # (tracing's process span outermost: the middleware's own spans are its children)
            outer = [*tracing.middleware(), *self.middleware]
            self._chained = chain(outer, lambda job: self._call(handler, job))
        try:
            await run_hook(self.on_startup, self)  # (raising: the worker does not start)
        except BaseException:
            if self._executor is not None:  # (its threads or child processes end now)
                self._executor.shutdown(wait=False, cancel_futures=True)
            raise
        self._started = True
        loop = asyncio.get_running_loop()
        self._fetchers = [
            loop.create_task(self._fetch(), name=f"dq-worker-fetch-{i}")
            for i in range(self.consumers)
        ]
        self._tasks.extend(self._fetchers)
        if self.heartbeat:
            self._tasks.append(loop.create_task(self._beat(), name="dq-worker-heartbeat"))
        if self._announce:
            self._tasks.append(loop.create_task(self.announcer.run(), name="dq-worker-announce"))

    async def serve(self, signals: bool = False) -> None:
        """Runs until ``stop()`` (or, with ``signals``, SIGTERM/SIGINT; a second one forces
        the stop), then shuts down; raises what made it stop on its own (a refused token)."""
        if signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._signalled)
        try:
            await self.start()
            await self._stopping.wait()
            await self.stop()
        finally:
            if signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        if self._fatal is not None:
            raise self._fatal

    def run(self) -> None:
        """``serve(signals=True)`` in a new event loop: the blocking entry point. Returns once
        nothing is reserved, at the latest ``shutdown_timeout`` after the stop plus a second
        for cancelled handlers to end: one that does not is left behind, never resumed; a sync
        handler still running keeps its thread, a daemon one (see docs/worker.md). The client
        is closed at the end: its connections belong to this loop, which ends with it."""

        async def main() -> None:
            try:
                await self.serve(signals=True)
            finally:
                await self.client.aclose()

        run_loop(main())

    def _signalled(self) -> None:
        if self._stopping.is_set():
            log.warning("second signal: stopping now, running jobs given back")
            self._forced.set()
        else:
            log.info("signal: stopping (running jobs get %.1f s)", self.shutdown_timeout)
            self._stopping.set()

    async def stop(self, force: bool = False) -> None:
        """Stops consuming, lets running handlers finish within ``shutdown_timeout`` (none
        with ``force``), gives back the jobs still held without spending a try, sends the
        pending acks. Returns when nothing is left reserved by this worker."""
        self._stopping.set()
        if force:
            self._forced.set()
        self._room.set()
        self._arrived.set()
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._shutdown())
        me = asyncio.current_task()
        if me is not None and any(d.task is me for d in self._held):
            return  # a handler stopping its worker: the shutdown waits for it, not it for that
        await asyncio.shield(self._closing)

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the loops ------------------------------------------------------------------------

    async def _fetch(self) -> None:
        pause = 0.1
        while not self._stopping.is_set():
            free = self.concurrency - len(self._held) - self._asked
            if free <= 0 or self._acks.waiting >= self._backlog:
                self._room.clear()
                await self._room.wait()
                continue
            sent, asked = time.monotonic(), min(free, self.batch)
            self._asked += asked
            try:
                jobs = await self.client.consume_many(
                    self.queues, asked, ttr=self.ttr, timeout=self.poll_timeout
                )
            except (TransportError, Unavailable, RateLimited, QueueFull) as e:
                log.warning("consume failed (again in %.1f s): %s", pause, e)
                await self._sleep(pause)
                pause = min(pause * 2, 5.0)
                continue
            except Exception as e:  # refused (a token, a name): repeating cannot help
                log.error("consume refused, worker stops: %s", e)
                self._fatal = e
                self._stopping.set()
                break
            finally:
                self._asked -= asked
            if len(jobs) < asked:
                self._room.set()  # the slots not filled are free for another consume
            pause = 0.1
            for job in jobs:
                d = Delivery(job, sent, self.ttr)
                self._held.add(d)
                if self._stopping.is_set():
                    continue  # given back by the shutdown
                if self._handler is None:
                    self._ready.append(d)
                else:
                    d.task = asyncio.get_running_loop().create_task(
                        self._run(d), name=f"dq-worker-job {job.queue}/{job.id}"
                    )
            if jobs:
                self._gauge()
                self._arrived.set()

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            pass

    async def _run(self, d: Delivery) -> None:
        # a task's own coroutine (never awaited by another): whatever the handler raises
        # reaches this frame, a GeneratorExit thrown into the task from a future included
        chained = self._chained
        assert chained is not None
        d.started = time.perf_counter()
        outcome: Outcome
        try:
            returned = await chained(d.job)
        except TimeLimitExceeded as e:
            log.warning("job %s of %s: %s", d.job.id, d.job.queue, e)
            self.counts["time_limited"] += 1
            if self._metrics is not None:
                self._metrics.time_limited.labels(d.job.queue).inc()
            outcome = decide(exc=e, bury_on=self.bury_on)
        except asyncio.CancelledError as e:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the shutdown cancelled it: the job is given back there
            # raised by the handler itself (an inner task cancelled): the handler failed
            log.warning("job %s of %s failed: handler raised CancelledError", d.job.id, d.job.queue)
            outcome = Released(error=describe(e))
        except (NoProcess, NotStarted) as e:  # not the job's fault: back unspent, in a while
            log.error("job %s of %s: %s: given back", d.job.id, d.job.queue, e)
            outcome = Snoozed(NO_PROCESS_WAIT, describe(e))
        except (KeyboardInterrupt, SystemExit) as e:
            # not the job's fault: it goes back unspent, and the worker stops gracefully
            # (serve() raises this once nothing is left reserved)
            log.error("handler raised %r: worker stops", e)
            outcome = GIVE_BACK
            self._fatal = self._fatal or e
            self._stopping.set()
        except BaseException as e:  # an Exception, GeneratorExit, a class of the handler's own
            tb = e.__traceback__
            if isinstance(e, GeneratorExit) and tb is not None and tb.tb_next is None:
                raise  # raised in this frame: this coroutine is closed (a task left behind)
            outcome = decide(exc=e, bury_on=self.bury_on)
            if isinstance(outcome, Released | Buried) and not isinstance(e, Retry | Bury):
                log.warning(
                    "job %s of %s failed: %s", d.job.id, d.job.queue, describe(e), exc_info=e
                )
        else:
            outcome = _ACKED if returned is None or not self.results else decide(returned)
        if self._metrics is not None:
            self._metrics.duration.labels(d.job.queue).observe(time.perf_counter() - d.started)
        if d.settled:  # the shutdown gave it back meanwhile
            return
        await self._finish(d, outcome)

    async def _call(self, handler: Handler, job: Job) -> Any:
        """The handler on ``job``, within the job's time limit (``TimeLimitExceeded``)."""
        executor = None if self._async else self._executor
        return await call_handler(handler, job, executor, job_limit(job, self.time_limit))

    async def _finish(self, d: Delivery, outcome: Outcome) -> None:
        """Sends the outcome of a job (once: the first caller claims it)."""
        if d.settled:
            return
        d.settled = True
        if d.lost or (type(outcome) is Acked and outcome.result is None):
            self._held.discard(d)
            self._room.set()
            if d.lost:
                self._report(d, "lost")
            else:
                self._acks.add(d)
            return
        self._report(d, await send_outcome(self.client, d.job, outcome))
        self._held.discard(d)  # only now: a stop waits for it while it is held
        self._room.set()
        self._gauge()

    async def _beat(self) -> None:
        """Touches every held job whose reservation is past half its ttr."""
        tick = max(0.02, min(1.0, self.ttr / 8))
        while True:
            await asyncio.sleep(tick)
            due = time.monotonic() - self.ttr / 2
            stale = [d for d in self._held if d.renewed <= due and not d.settled and not d.lost]
            if stale:
                await asyncio.gather(*(self._touch(d) for d in stale))

    async def _touch(self, d: Delivery) -> None:
        sent = time.monotonic()
        what = await renew(self.client, d.job, self.ttr)
        if what == "":
            d.renewed, d.deadline = sent, sent + self.ttr
        elif what == "lost" and not d.settled:
            d.lost = True

    async def _shutdown(self) -> None:
        deadline = time.monotonic() + (0.0 if self._forced.is_set() else self.shutdown_timeout)
        fetching = self._fetchers
        while not self._forced.is_set():
            # running: a handler's task, or a job the iterator gave out, not settled yet
            busy = [
                d
                for d in self._held
                if (d.task is not None and not d.task.done()) or d.job.id in self._yielded
            ]
            left = deadline - time.monotonic()
            polls = [t for t in fetching if not t.done()]
            if (not busy and not polls) or left <= 0:
                break
            self._room.clear()
            wake: list[asyncio.Future[Any]] = [
                asyncio.ensure_future(e.wait()) for e in (self._room, self._forced)
            ]
            wake.extend(polls)
            await asyncio.wait(wake, timeout=left, return_when="FIRST_COMPLETED")
            for w in wake[:2]:
                w.cancel()
        for t in fetching:  # a long-poll still waiting: what it reserves comes back after ttr
            t.cancel()
        if fetching:  # (ended, its connection closed, before jobs are given back: else the
            await asyncio.wait(fetching, timeout=1.0)  # service's poll may take one again)
        # whatever is still held goes back without spending a try
        back = [d for d in self._held if not d.settled]
        self._say_running(back)
        for d in back:
            if d.task is not None:
                d.task.cancel()
        if self._executor is not None:  # (children still running are killed before their
            self._executor.shutdown(wait=False, cancel_futures=True)  # jobs go back)
        self._ready.clear()
        await asyncio.gather(*(self._finish(d, GIVE_BACK) for d in back))
        # outcomes already on their way (a release at a time limit): sent before stop returns
        sending = [d.task for d in self._held if d.settled and d.task and not d.task.done()]
        if sending:
            await asyncio.wait(sending, timeout=10.0)
        await self._acks.drain()
        for t in self._tasks:
            t.cancel()
        if self._announce:  # (an announcement on its way must not land after the retire)
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.announcer.retire()
        self._gauge()
        log.info("worker stopped: %s", self.counts)
        if self._started:
            try:  # (bounded as the handlers were: a stop ends)
                await asyncio.wait_for(run_hook(self.on_shutdown, self), self.shutdown_timeout)
            except Exception:  # the jobs are settled: the hook's failure is only reported
                log.exception("on_shutdown failed")

    def _say_running(self, back: list[Delivery]) -> None:
        """One line naming the jobs given back while their handler still runs."""
        running = [
            d
            for d in back
            if (d.task is not None and not d.task.done()) or d.job.id in self._yielded
        ]
        if not running:
            return
        why = (
            "stop forced"
            if self._forced.is_set()
            else f"shutdown timeout ({self.shutdown_timeout:g} s)"
        )
        jobs = ", ".join(f"{d.job.queue}/{d.job.id}" for d in running[:SAY_JOBS])
        if len(running) > SAY_JOBS:
            jobs += f" and {len(running) - SAY_JOBS} more"
        if self._handler is None:
            what = f"{len(running)} job(s) given out by the iterator not settled"
        else:
            what = f"handler {_name(self._handler)} still running on {len(running)} job(s)"
            if self._executor is not None and self._executor.stops_abandoned:
                what += " (their processes are killed)"
            elif not self._async:  # a thread cannot be stopped: it runs on, as a daemon
                what += " (its threads run on; they do not hold the process at exit)"
        log.warning("%s: %s, given back without spending a try: %s", why, what, jobs)

    # -- accounting -----------------------------------------------------------------------

    def _report(self, d: Any, what: str) -> None:
        self.counts[what] += 1
        self._room.set()  # a confirmed ack may unblock a consume held back by the backlog
        if self._metrics is not None:
            self._metrics.count(d.job.queue, what)
            if what == "acked":
                self._gauge()
        done: asyncio.Future[str] | None = d.done
        if done is not None and not done.done():
            done.set_result(what)

    def _gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.in_flight.set(len(self._held))


_ACKED = Acked()
SAY_JOBS = 20  # jobs named in the stop's line, at most


def _name(handler: Handler) -> str:
    """``module:qualname`` of a handler (as the command takes it), else its repr."""
    module = getattr(handler, "__module__", None)
    qualname = getattr(handler, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else repr(handler)


# -- the command ------------------------------------------------------------------------


async def _serve(args: argparse.Namespace) -> None:
    options = worker_options(args)  # (what is not found is said before anything else)
    client = AsyncClient(args.url, args.token, args.namespace, max_connections=64)
    async with client:
        worker = Worker(client, args.queue, **options)
        await worker.serve(signals=True)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m cluster_dq.client.worker module:function --queue q ...`` (or ``python -m
    cluster_dq.client``): runs a ``Worker`` with a handler found by name until SIGTERM/SIGINT
    (a second one forces the stop)."""
    # only the command runs on uvloop: a Worker inside a program runs on that program's loop
    import uvloop

    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.metrics_port is not None:  # (prometheus_client imported only then)
        from cluster_dq.client._wmetrics import serve

        serve(args.metrics_port)
    sys.path.insert(0, "")  # handlers are found from the current directory, as python -m does
    code: int = 0
    try:
        run_loop(_serve(args), uvloop.new_event_loop)
    except (ValueError, DQError) as e:  # a bad setting, a refused token: one line, no traceback
        raise SystemExit(f"error: {e}") from None
    except SystemExit as e:  # a handler's sys.exit(): the worker stopped gracefully first
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:  # sys.exit("message"): said on stderr, status 1, as Python does
            print(e.code, file=sys.stderr)
            code = 1
    threads, tasks = len(_runner.busy), len(_runner.abandoned)
    if threads or tasks:
        # handlers still running past the stop (named in the worker's line): their jobs were
        # given back and the acks sent; nothing is left to wait for, and an interpreter's
        # exit could still trip on a thread (a lock held, a daemon writing at finalization)
        log.warning(
            "exiting now with %d handler thread(s) and %d task(s) still running",
            threads,
            tasks,
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
