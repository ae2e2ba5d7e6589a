"""The worker's batch ack: acks gathered per queue and sent as one ``ack_many`` (each with its
lease) when ``size`` are waiting or ``delay`` seconds after the first; each job is reported
done only once the service confirmed its ack, lost when its lease no longer held it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from cluster_dq.client._async.client import AsyncClient
from cluster_dq.client.errors import DQError, LeaseLost, RateLimited, TransportError, Unavailable
from cluster_dq.client.models import Job

log = logging.getLogger("cluster_dq.worker")
MAX_ACK_BATCH = 1000  # the service's limit per batch ack


class Entry(Protocol):
    job: Job
    deadline: float  # monotonic time after which the lease cannot hold any more


Report = Callable[[Entry, str], None]  # (entry, "acked" | "lost" | "failed")


class AckBatcher:
    """Pending acks of one worker. ``report`` is called once per entry with what became of it."""

    def __init__(self, client: AsyncClient, report: Report, delay: float, size: int) -> None:
        if not 1 <= size <= MAX_ACK_BATCH:
            raise ValueError(f"ack batch size must be 1..{MAX_ACK_BATCH}, not {size}")
        self._client, self._report, self._delay, self._size = client, report, delay, size
        self._pending: dict[str, list[Entry]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self.waiting = 0  # entries not yet confirmed (pending or being sent)

    def add(self, entry: Entry) -> None:
        queue = entry.job.queue
        batch = self._pending.get(queue)
        if batch is None:
            batch = self._pending[queue] = []
        batch.append(entry)
        self.waiting += 1
        if len(batch) >= self._size:
            self._send(queue)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self.flush)

    def flush(self) -> None:
        """Sends every pending ack now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for queue in list(self._pending):
            self._send(queue)

    async def drain(self) -> None:
        """Sends every pending ack and waits until each is confirmed or given up."""
        self.flush()
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    def _send(self, queue: str) -> None:
        batch = self._pending.pop(queue, None)
        if batch:
            task = asyncio.get_running_loop().create_task(self._ack(queue, batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    def _done(self, entries: list[Entry], what: str) -> None:
        self.waiting -= len(entries)
        for e in entries:
            self._report(e, what)

    async def _ack(self, queue: str, entries: list[Entry]) -> None:
        pause = 0.1
        while entries:
            try:
                # (the jobs themselves, each with its lease: a settle span links their producers)
                await self._client.ack_many(queue, [e.job for e in entries])
            except LeaseLost as exc:
                # nothing was acked: drop the jobs the service named, ack the others again
                body = exc.body if isinstance(exc.body, dict) else {}
                named = {c.get("job_id") for c in body.get("conflicts", ()) if c}
                lost = [e for e in entries if e.job.id in named] or entries
                log.warning("ack: %d job(s) of %s no longer held (%s)", len(lost), queue, exc)
                self._done(lost, "lost")
                entries = [e for e in entries if e not in lost]
            except (TransportError, Unavailable, RateLimited) as exc:
                # the client's retries are spent; repeating is safe (leases) while they hold
                now = time.monotonic()
                late = [e for e in entries if e.deadline <= now]
                if late:
                    log.warning("ack of %d job(s) of %s not confirmed: %s", len(late), queue, exc)
                    self._done(late, "failed")
                    entries = [e for e in entries if e.deadline > now]
                if entries:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 2.0)
            except DQError as exc:
                log.error("ack of %d job(s) of %s refused: %s", len(entries), queue, exc)
                self._done(entries, "failed")
                return
            else:
                self._done(entries, "acked")
                return
