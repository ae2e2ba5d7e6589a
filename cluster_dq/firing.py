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
import os
from collections.abc import Awaitable, Callable

from cluster_dq import metrics as m
from cluster_dq.engine import commands
from cluster_dq.engine import schedules as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.core import cancelling, end_if_cancelled
from cluster_dq.errors import NotReplicated, RedisFailure
from cluster_dq.metrics import PoolMetrics
from cluster_dq.queueconf import QueueSettings
from cluster_dq.schedules import CLAIM_LEASE_MS, occurrence_id

log = logging.getLogger(__name__)

BATCH = 64  # schedules claimed per look at a shard's timers


async def carry_settings(src: AsyncEngine, dst: AsyncEngine, ns: str, q: str) -> bool:
    """A queue moving from ``src`` to ``dst`` takes its own settings along (pause, max size,
    defaults, backoff): written on ``dst`` when it holds none yet, so that none set there
    since is overwritten. True when they were written."""
    none = QueueSettings()
    if await dst.run(commands.queue_settings(ns, q), idempotent=True) != none:
        return False
    old = await src.run(commands.queue_settings(ns, q), idempotent=True)
    if old == none:
        return False
    await dst.run(commands.configure(dst.config, ns, q, old.as_changes()), idempotent=True)
    return True


async def move_schedule(src: AsyncEngine, dst: AsyncEngine, ns: str, q: str, name: str) -> bool:
    """Moves one schedule of a queue that moves from pool ``src`` to pool ``dst`` (a
    migration), so that each occurrence is published once, by one pool: (1) on ``src`` the
    schedule stops firing (``mark_moving``: one compare-and-set, which a firer's claim there
    loses or wins whole); (2) what ``src`` claimed and may not have published yet is
    published on ``src`` again (the same ids there: a duplicate if it was); (3) the queue's
    settings are carried to ``dst`` if it has none, then the schedule is put there with its
    state (the next occurrence ``src`` had not claimed, its counts), unless ``dst`` has one of
    that name already; (4) it is removed from ``src``. Each step is safe to repeat: a move cut
    short is finished by the next one (the firer's, or a request's for the queue's
    schedules). True when the schedule was on ``src``."""
    marked = await src.run(ops.mark_moving(src.config, ns, q, name), idempotent=True)
    if marked is None:
        return False
    schedule, moving = marked
    carried = moving.with_(
        gen=os.urandom(6).hex(), paused=ops.was_paused(moving), flying=(), claim_ms=0
    )
    if moving.flying:
        now = src.clock()
        if now - moving.claim_ms < src.config.remember_acked_ms - CLAIM_LEASE_MS:
            specs = [
                schedule.job.spec(occurrence_id(name, t), t + schedule.job.delay_ms)
                for t in moving.flying
            ]
            op = commands.publish(src.config, ns, q, specs, now)
            try:
                published = await src.run(op, idempotent=True, durable=True)
            except NotReplicated as e:  # written on the master
                published = e.result
            refused = sum(1 for p in published if p.full)
            carried = carried.with_(
                fired=carried.fired + len(specs) - refused, missed=carried.missed + refused
            )
        else:  # as ``schedules.plan``: too old to be told from a new job
            carried = carried.with_(missed=carried.missed + len(moving.flying))
    await carry_settings(src, dst, ns, q)
    await dst.run(ops.adopt(dst.config, ns, q, schedule, carried), idempotent=True)
    await src.run(ops.forget_moved(src.config, ns, q, name, moving), idempotent=True)
    log.info("schedule %s/%s/%s moved to the queue's new pool", ns, q, name)
    return True


class Firer:
    def __init__(
        self,
        engine: AsyncEngine,
        leads: Callable[[int], bool],
        *,
        poll_ms: int = 1_000,  # idle look: a schedule created or resumed elsewhere is seen
        metrics: PoolMetrics | None = None,
        move_to: AsyncEngine | None = None,
        led: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.engine = engine
        self.leads = leads
        # Returns once this instance leads the shard (the pump's); without it, a firer that
        # does not lead looks again every 0.2 s.
        self.led = led
        self.poll_ms = poll_ms
        self.metrics = metrics
        # The pool this one migrates to (``MigrateTo``): its schedules are moved there, not
        # fired here, each as soon as this firer sees its timer, due or not.
        self.move_to = move_to

    async def fire_shard(self, shard: int) -> int:
        """Runs the shard's due firing steps once; returns ms until the next is due."""
        if self.move_to is not None:
            return await self._move_shard(shard, self.move_to)
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

    async def _move_shard(self, shard: int, dst: AsyncEngine) -> int:
        """Moves the shard's scheduled schedules to ``dst`` (a paused one has no timer: it
        moves when a request for its queue's schedules comes)."""
        members = await self.engine.run(ops.timers(shard, BATCH), idempotent=True)
        for member in members:
            if not self.leads(shard):
                return 0
            ns, q, name = ops.parse_member(member)
            if not await move_schedule(self.engine, dst, ns, q, name):
                await self.engine.run(ops.drop_timer(self.engine.config, ns, q, name))
        return 0 if len(members) >= BATCH else self.poll_ms

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
            end_if_cancelled()
            if not self.leads(shard):
                await (self.led(shard) if self.led else asyncio.sleep(0.2))
                continue
            try:
                wait_ms = await self.fire_shard(shard)
                failures = 0
            except asyncio.CancelledError:
                raise
            except RedisFailure as e:
                if cancelling():  # redis-py can turn a cancellation into a connection error
                    raise asyncio.CancelledError from e
                failures += 1
                wait_ms = min(200 * 2 ** min(failures - 1, 5), 5_000)
                log.warning("firer shard %d: %s: %s", shard, type(e).__name__, e)
            except Exception:  # a bug must not end the shard's firing for good
                log.exception("firer shard %d step failed", shard)
                wait_ms = 1_000
            if wait_ms > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.sleep(wait_ms / 1000)
