"""Test mode for a worker's handlers: ``run_job`` runs a handler on a made-up job in-process,
with no service, and returns the outcome the real ``Worker`` would send, decided by the same
rule (``outcomes.decide``): ``Acked(result)``, ``Released(delay, error)``,
``Snoozed(delay, error)`` or ``Buried(reason)``.

    from cluster_dq.client.testing import run_job, Acked
    assert run_job(handler, {"order": 42}) == Acked()
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cluster_dq.client._call import Middleware, Next, call_handler, chain, job_limit
from cluster_dq.client._runner import DaemonThreads
from cluster_dq.client.models import Job
from cluster_dq.client.outcomes import (
    Acked,
    Buried,
    Outcome,
    Released,
    Snoozed,
    decide,
    describe,
)
from cluster_dq.client.worker import Handler, _is_async

__all__ = ["Acked", "Buried", "Outcome", "Released", "Snoozed", "arun_job", "make_job", "run_job"]


def make_job(
    body: bytes | str | Any = b"",
    *,
    queue: str = "test",
    namespace: str = "test",
    job_id: str = "01TESTJOB0000000000000000A",
    remain_tries: int = 0,
    deliveries: int = 1,
    attributes: Mapping[str, str] | None = None,
    last_error: str | None = None,
    group: str | None = None,
) -> Job:
    """A job as a consume would give it. ``body``: bytes, text, or any JSON value (encoded)."""
    if isinstance(body, str):
        raw = body.encode()
    elif isinstance(body, bytes | bytearray):
        raw = bytes(body)
    else:
        raw = json.dumps(body).encode()
    return Job(
        namespace=namespace,
        queue=queue,
        id=job_id,
        body=raw,
        ttl=0.0,
        elapsed_ms=0,
        remain_tries=remain_tries,
        attributes=dict(attributes) if attributes else None,
        state="reserved",
        deliveries=deliveries,
        lease="0123456789abcdef",
        last_error=last_error,
        group=group,
    )


async def arun_job(
    handler: Handler,
    body: bytes | str | Any = b"",
    *,
    bury_on: tuple[type[BaseException], ...] = (),
    results: bool = True,
    time_limit: float | None = None,
    middleware: Sequence[Middleware] = (),
    job: Job | None = None,
    **job_fields: Any,
) -> Outcome:
    """``run_job`` inside a running event loop (a sync handler runs in a thread, as in the
    worker)."""
    job = job if job is not None else make_job(body, **job_fields)
    threads = None if _is_async(handler) else DaemonThreads(1, "dq-test")
    limit = job_limit(job, time_limit)
    call = chain(middleware, lambda j: call_handler(handler, j, threads, limit))
    try:
        returned, exc = await asyncio.get_running_loop().create_task(_call(call, job))
    finally:
        if threads is not None:
            threads.shutdown(wait=False)
    if exc is None:
        return decide(returned if results else None)
    if isinstance(exc, asyncio.CancelledError):  # the handler's own, not a cancel of this call
        return Released(error=describe(exc))
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        raise exc  # the worker gives the job back unspent and stops: here, the test stops
    return decide(exc=exc, bury_on=bury_on)


async def _call(call: Next, job: Job) -> tuple[Any, BaseException | None]:
    """The handler's return value or exception, run as a task's own coroutine (as the
    worker runs it): an exception an awaited future ends with is thrown into the outermost
    coroutine of the task, and a ``GeneratorExit`` thrown there closes the frames it awaits
    through instead of reaching them."""
    try:
        return await call(job), None
    except asyncio.CancelledError as e:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this call was cancelled
        return None, e
    except BaseException as e:  # any other, KeyboardInterrupt and SystemExit too (see above)
        return None, e


def run_job(
    handler: Handler,
    body: bytes | str | Any = b"",
    *,
    bury_on: tuple[type[BaseException], ...] = (),
    results: bool = True,
    time_limit: float | None = None,
    middleware: Sequence[Middleware] = (),
    job: Job | None = None,
    **job_fields: Any,
) -> Outcome:
    """Runs ``handler`` on one job (``job``, or one made by ``make_job(body, **job_fields)``)
    and returns its outcome; ``bury_on``, ``results``, ``time_limit`` and ``middleware`` as the
    ``Worker``'s. Not inside a running event loop: use ``arun_job`` there."""
    return asyncio.run(
        arun_job(
            handler,
            body,
            bury_on=bury_on,
            results=results,
            time_limit=time_limit,
            middleware=middleware,
            job=job,
            **job_fields,
        )
    )
