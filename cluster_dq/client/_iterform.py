"""The worker's held jobs (``Delivery``) and its iterator form: ``async for job in worker``,
each job settled with ``ack`` / ``release`` / ``snooze`` / ``bury`` or inside a
``worker.settle(job)`` block, by the same rule as a handler (``outcomes.decide``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from cluster_dq.client.models import Job
from cluster_dq.client.outcomes import (
    Bury,
    Outcome,
    Released,
    Retry,
    Snooze,
    Snoozed,
    decide,
    describe,
)

if TYPE_CHECKING:
    from cluster_dq.client._wmetrics import WorkerMetrics

log = logging.getLogger("cluster_dq.worker")
GIVE_BACK = Snoozed(0.0)  # a stop gives held jobs back: no try spent, last error kept


class Delivery:
    """One job this worker holds, from its consume until its outcome is sent."""

    __slots__ = ("job", "renewed", "deadline", "lost", "settled", "task", "started", "done")

    def __init__(self, job: Job, sent: float, ttr: float) -> None:
        self.job = job
        self.renewed = sent  # when the reservation was last (re)started, at the latest
        self.deadline = sent + ttr  # after this, the lease cannot hold any more
        self.lost = False  # a touch found the lease gone: the job was taken back
        self.settled = False  # its outcome is claimed (by the handler's end or the shutdown)
        self.task: asyncio.Task[None] | None = None
        self.started = 0.0
        self.done: asyncio.Future[str] | None = None  # iterator form: the ack's confirmation


class IteratorForm:
    """The iterator form of ``Worker`` (its state and the loop are the worker's)."""

    _handler: Any
    _ready: deque[Delivery]
    _yielded: dict[str, Delivery]
    _stopping: asyncio.Event
    _arrived: asyncio.Event
    _metrics: WorkerMetrics | None
    bury_on: tuple[type[BaseException], ...]

    async def start(self) -> None:
        raise NotImplementedError

    async def _finish(self, d: Delivery, outcome: Outcome) -> None:
        raise NotImplementedError

    def __aiter__(self) -> AsyncIterator[Job]:
        if self._handler is not None:
            raise TypeError("a worker with a handler runs it; iterate over one without")
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Job]:
        await self.start()
        while True:
            while not self._ready:
                if self._stopping.is_set():
                    return
                self._arrived.clear()
                await self._arrived.wait()
            if self._stopping.is_set():
                return
            d = self._ready.popleft()
            d.started = time.perf_counter()
            self._yielded[d.job.id] = d
            yield d.job

    def _claim(self, job: Job) -> Delivery | None:
        d = self._yielded.get(job.id)
        if d is None or d.job is not job:
            raise ValueError(f"job {job.id} is not one this worker gave out, or it is settled")
        del self._yielded[job.id]
        if self._metrics is not None:
            self._metrics.duration.labels(job.queue).observe(time.perf_counter() - d.started)
        return None if d.settled else d

    async def ack(self, job: Job, result: Any = None, *, wait: bool = False) -> str:
        """Acks a job the iterator gave (batched; ``result``: JSON, sent at once). With
        ``wait``, returns once the service confirmed it: ``acked``, ``lost`` or ``failed``.
        A result that is not JSON, or too large, is a ValueError (the job stays held)."""
        outcome = decide(result)
        if isinstance(outcome, Released):
            raise ValueError(outcome.error)
        d = self._claim(job)
        if d is None:
            return "lost"
        if wait:
            d.done = asyncio.get_running_loop().create_future()
        await self._finish(d, outcome)
        return await d.done if d.done is not None else "sent"

    async def release(self, job: Job, delay: float | None = None, error: str | None = None) -> None:
        """Gives the job back to be tried again (the delivery counts)."""
        await self._settle_with(job, decide(exc=Retry(delay, error)))

    async def snooze(self, job: Job, delay: float, error: str | None = None) -> None:
        """Gives the job back for ``delay`` seconds without spending a try."""
        await self._settle_with(job, decide(exc=Snooze(delay, error)))

    async def bury(self, job: Job, reason: str = "buried") -> None:
        """Sends the job to the dead letter."""
        await self._settle_with(job, decide(exc=Bury(reason)))

    async def _settle_with(self, job: Job, outcome: Outcome) -> None:
        d = self._claim(job)
        if d is not None:
            await self._finish(d, outcome)

    @asynccontextmanager
    async def settle(self, job: Job) -> AsyncIterator[Job]:
        """``async with worker.settle(job):`` the block is the handler: leaving it acks the
        job (unless it was settled inside), an exception settles it as a handler's would
        (``decide``) and is not raised further; a cancellation gives the job back."""
        try:
            yield job
        except Exception as e:
            if job.id in self._yielded:
                await self._settle_with(job, decide(exc=e, bury_on=self.bury_on))
            if not isinstance(e, Retry | Snooze | Bury):
                log.warning("job %s of %s failed: %s", job.id, job.queue, describe(e), exc_info=e)
        except BaseException:
            if job.id in self._yielded:
                await asyncio.shield(self._settle_with(job, GIVE_BACK))
            raise
        else:
            if job.id in self._yielded:
                await self.ack(job)
