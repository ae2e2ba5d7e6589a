"""The firer of recurring jobs: for each shard this process leads, a loop that sleeps until
the shard's earliest schedule timer and runs the firing steps that are due.

It runs beside the pump and under its leadership (``Pump.leads``): one firer per shard. The
cost follows the occurrences that are due, not the number of schedules: a schedule at rest is
one timer entry, looked at when its next occurrence comes. Two firers at once (a stalled
leader whose lease ran out) can only waste work: each occurrence is claimed by one
compare-and-set (``engine/schedules.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from cluster_dq import metrics as m
from cluster_dq.engine import schedules as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.errors import NotReplicated, RedisFailure
from cluster_dq.metrics import PoolMetrics

log = logging.getLogger(__name__)

BATCH = 64  # schedules claimed per look at a shard's timers


class Firer:
    def __init__(
        self,
        engine: AsyncEngine,
        leads: Callable[[int], bool],
        *,
        poll_ms: int = 1_000,  # idle look: a schedule created or resumed elsewhere is seen
        metrics: PoolMetrics | None = None,
    ) -> None:
        self.engine = engine
        self.leads = leads
        self.poll_ms = poll_ms
        self.metrics = metrics

    async def fire_shard(self, shard: int) -> int:
        """Runs the shard's due firing steps once; returns ms until the next is due."""
        now = self.engine.clock()
        due, head = await self.engine.run(ops.look(shard, now, BATCH), idempotent=True)
        if not due:  # idle: one round trip, then sleep until the earliest timer
            return self._wait(head)
        more = len(due) >= BATCH
        for member, lease in due:
            if not self.leads(shard):
                return 0
            fired = await self._fire(shard, member, lease)
            more = more or fired.more
        if more:
            return 0
        return self._wait(await self.engine.run(ops.next_timer(shard), idempotent=True))

    def _wait(self, head: int | None) -> int:
        """ms to sleep before the next look: until the earliest timer, ``poll_ms`` at most."""
        if head is None:
            return self.poll_ms
        return max(0, min(head - self.engine.clock(), self.poll_ms))

    async def _fire(self, shard: int, member: str, lease: float) -> ops.Fired:
        op = ops.fire(self.engine.config, shard, member, lease, self.engine.clock())
        try:
            fired = await self.engine.run(op, idempotent=True, durable=True)
        except NotReplicated as e:  # written on the master: the state moved on with it
            log.warning("schedule %s fired, not confirmed by replicas: %s", member, e)
            fired = e.result
        if self.metrics and (fired.published or fired.missed):
            ns, q, _ = ops.parse_member(member)
            sink = self.metrics.metrics
            sink.count(m.schedule_published, ns, q, fired.published)
            sink.count(m.published, ns, q, fired.created)
            sink.count(m.schedule_missed, ns, q, fired.missed)
        if fired.missed:
            log.warning("schedule %s: %d occurrence(s) missed", member, fired.missed)
        return fired

    async def run(self, shard: int, stopping: Callable[[], bool]) -> None:
        failures = 0
        while not stopping():
            if not self.leads(shard):
                await asyncio.sleep(0.2)
                continue
            try:
                wait_ms = await self.fire_shard(shard)
                failures = 0
            except asyncio.CancelledError:
                raise
            except RedisFailure as e:
                failures += 1
                wait_ms = min(200 * 2 ** min(failures - 1, 5), 5_000)
                log.warning("firer shard %d: %s: %s", shard, type(e).__name__, e)
            except Exception:  # a bug must not end the shard's firing for good
                log.exception("firer shard %d step failed", shard)
                wait_ms = 1_000
            if wait_ms > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.sleep(wait_ms / 1000)
