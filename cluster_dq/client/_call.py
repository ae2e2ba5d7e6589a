"""How the worker calls a handler on one job: on the event loop (async) or in one of its
threads (sync), within the job's time limit, inside the middleware the worker was given."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from cluster_dq.client._runner import NotStarted, Pool, started
from cluster_dq.client.models import Job
from cluster_dq.client.outcomes import TimeLimitExceeded, seconds_text

log = logging.getLogger("cluster_dq.worker")
Handler = Callable[[Job], Any]
RECHECK_S = 0.05  # how often a call waiting its turn looks again, at the least
# The rest of the chain, as a middleware sees it: call it with the job, await what it returns.
Next = Callable[[Job], Awaitable[Any]]
Middleware = Callable[[Job, Next], Awaitable[Any]]

# A job's own time limit (seconds), an attribute its producer sets; at most the worker's:
# digits, with at most 3 decimals ("30", "0.5").
TIME_LIMIT = "time_limit"
_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,3})?")


def job_limit(job: Job, worker_limit: float | None) -> float | None:
    """The job's time limit: its attribute ``time_limit`` (seconds), at most the worker's."""
    raw = (job.attributes or {}).get(TIME_LIMIT)
    own: float | None = None
    if raw is not None:
        own = float(raw) if _SECONDS.fullmatch(raw) else None
        if not own:
            log.warning("job %s: its time_limit %r is not seconds > 0: ignored", job.id, raw)
            own = None
    limits = [t for t in (own, worker_limit) if t is not None]
    return min(limits) if limits else None


async def call_handler(
    handler: Handler, job: Job, executor: Pool | None, limit: float | None
) -> Any:
    """``handler(job)``: awaited on the loop when ``executor`` is None, else in one of its
    threads or processes; past ``limit`` seconds, ``TimeLimitExceeded`` (an async handler
    cancelled, a sync one abandoned in its thread, which the executor replaces, or its
    process killed). A sync handler's limit counts from when its thread or process began it;
    a call waiting for one behind handlers within their limits waits on, but one that reaches
    its limit while handlers past theirs hold every thread is cancelled (``NotStarted``: not
    the job's fault, it goes back unspent)."""
    if executor is None:
        if limit is None:
            return await handler(job)
        try:
            async with asyncio.timeout(limit) as scope:
                return await handler(job)
        except TimeoutError:
            if scope.expired():  # (not a TimeoutError of the handler's own)
                raise TimeLimitExceeded(limit) from None
            raise
    running = executor.submit(handler, job)
    if limit is None:
        return await asyncio.wrap_future(running)
    waiting = asyncio.wrap_future(running)
    try:
        done, _ = await asyncio.wait({waiting}, timeout=limit)
        while not done:
            if started(running) is None:  # waiting its turn: not timed yet
                if executor.stuck() and running.cancel():  # handlers past their limits hold
                    raise NotStarted(limit)  # every thread: it might wait for ever
                if started(running) is None:  # behind handlers within theirs: it gets one
                    done, _ = await asyncio.wait({waiting}, timeout=max(limit, RECHECK_S))
                    continue
            left = (started(running) or 0.0) + limit - time.monotonic()
            if left <= 0:
                break
            done, _ = await asyncio.wait({waiting}, timeout=left)  # the rest of its limit
    except asyncio.CancelledError:
        running.cancel()  # (a call not started yet never starts)
        raise
    if done:
        return done.pop().result()
    if running.done() and not running.cancelled():  # (it ended just at the limit: it counts)
        return running.result()
    waiting.add_done_callback(_ignored)  # what it ends with is no one's: not "never retrieved"
    if executor.stops_abandoned and executor.abandon(running):
        log.error(
            "job %s of %s: its handler still ran at the time limit of %s s: its process was "
            "killed and is replaced",
            job.id,
            job.queue,
            seconds_text(limit),
        )
        raise TimeLimitExceeded(limit)
    if executor.abandon(running):
        what = f"left to finish in its thread ({executor.abandoned()} such now)"
    else:
        what = "left to finish, keeping its thread's place (too many abandoned already)"
    log.error(
        "job %s of %s: its sync handler still runs past the time limit of %s s; %s, its "
        "result ignored",
        job.id,
        job.queue,
        seconds_text(limit),
        what,
    )
    raise TimeLimitExceeded(limit)


def _ignored(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def chain(middleware: Sequence[Middleware], inner: Next) -> Next:
    """``inner`` wrapped in ``middleware``, the first one outermost (Starlette's order)."""
    call = inner
    for mw in reversed(middleware):
        call = _wrap(mw, call)
    return call


def _wrap(mw: Middleware, call_next: Next) -> Next:
    async def wrapped(job: Job) -> Any:
        return await mw(job, call_next)

    return wrapped


async def run_hook(hook: Callable[[Any], Any] | None, worker: Any) -> None:
    """A worker's ``on_startup`` / ``on_shutdown``: a function or a coroutine function of the
    worker."""
    if hook is not None:
        done = hook(worker)
        if inspect.isawaitable(done):
            await done
