"""Queues: their sizes, heads and one job by id; their own settings (pause, max size, defaults),
destroy, and the page of a namespace's queues."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import Sizes
from cluster_dq.errors import NotFound
from cluster_dq.models import Job, JobResult, JobState
from cluster_dq.pools import RedisPool
from cluster_dq.queueconf import QueueSettings
from cluster_dq.routing import PoolRoute
from cluster_dq.service.core import ServiceCore
from cluster_dq.service.failures import written_before


class Queues(ServiceCore):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (ns, q) -> (monotonic s when read, the queue's settings): its default ttr and tries
        self._queue_settings: dict[tuple[str, str], tuple[float, QueueSettings]] = {}

    async def peek(self, route: PoolRoute[RedisPool], ns: str, q: str) -> Job:
        job = await self._first(
            route, ns, q, lambda p: ops.peek(p.engine.config, ns, q, "ready", p.engine.clock())
        )
        if job is None:
            raise NotFound("the queue is empty")
        return job

    async def peek_job(
        self, route: PoolRoute[RedisPool], ns: str, q: str, job_id: str
    ) -> Job | JobResult:
        """One job in any state (with its progress), or, once it is gone, the result it was
        acked with while that is kept."""
        done: JobResult | None = None
        for pool in route.place(ns, q).reads:
            op = ops.lookup_job(ns, q, job_id, pool.engine.clock())
            found = await self._run(pool, op, idempotent=True)
            if isinstance(found, Job):
                return found
            done = done or found
        if done is None:
            raise NotFound("job not found")
        return done

    async def heads(
        self, route: PoolRoute[RedisPool], ns: str, q: str, state: JobState, limit: int
    ) -> list[Job]:
        """The first ``limit`` ready jobs (delivery order), delayed jobs (due order) or reserved
        jobs (ttr deadline order) of the queue, over the pools that hold it; read-only (the
        dashboard's look)."""
        out: list[Job] = []
        for pool in route.place(ns, q).reads:
            out += await self._run(pool, ops.heads(ns, q, state, limit), idempotent=True)
        if state is not JobState.READY:
            out.sort(key=lambda j: j.due_ms or 0)
        return out[:limit]

    async def sizes(self, route: PoolRoute[RedisPool], ns: str, q: str) -> Sizes:
        total = Sizes(0, 0, 0, 0, None)
        for pool in route.place(ns, q).reads:
            s = await self._run(pool, ops.sizes(pool.engine.config, ns, q), idempotent=True)
            events = [t for t in (total.next_event_ms, s.next_event_ms) if t is not None]
            total = Sizes(
                total.delayed + s.delayed,
                total.ready + s.ready,
                total.reserved + s.reserved,
                total.dead + s.dead,
                min(events) if events else None,
            )
        return total

    async def destroy(self, route: PoolRoute[RedisPool], ns: str, q: str) -> int:
        reads = route.place(ns, q).reads
        n = sum(
            [
                await self._run(p, ops.destroy(p.engine.config, ns, q), idempotent=True)
                for p in reads
            ]
        )
        self.metrics.forget_queue(ns, q)
        return n

    async def queue_settings(self, route: PoolRoute[RedisPool], ns: str, q: str) -> QueueSettings:
        """The queue's own settings, as the pool that takes its new jobs holds them."""
        place = route.place(ns, q)
        await self._carry_settings(place, ns, q)
        got = await self._run(place.write, ops.queue_settings(ns, q), idempotent=True)
        self._queue_settings[(ns, q)] = (time.monotonic(), got)
        return got

    async def configure(
        self, route: PoolRoute[RedisPool], ns: str, q: str, changes: Sequence[tuple[str, str]]
    ) -> QueueSettings:
        """Changes the queue's own settings (validated: ``queueconf.parse_changes``) on every
        pool that holds its jobs (a migration: the pools drained too, the write pool last),
        and answers them. Idempotent: pause and resume twice change nothing more."""
        got = QueueSettings()
        for i, pool in enumerate(route.place(ns, q).reads):
            with written_before(i > 0, idempotent=True):
                got = await self._run(
                    pool, ops.configure(pool.engine.config, ns, q, changes), idempotent=True
                )
        self._queue_settings[(ns, q)] = (time.monotonic(), got)
        return got

    async def pause(
        self, route: PoolRoute[RedisPool], ns: str, q: str, paused: bool, create: bool = False
    ) -> QueueSettings:
        """Pauses or resumes a queue. One that does not exist on any pool that holds it (no job,
        no settings, no schedule: a typo, most likely) is a NotFound and nothing is written,
        unless ``create`` (a pause asked for before the queue's first publish)."""
        if not create:
            reads = route.place(ns, q).reads
            for pool in reads:
                if await self._run(pool, ops.queue_known(ns, q), idempotent=True):
                    break
            else:
                raise NotFound(
                    f"queue {ns}/{q} not found (no job, settings or schedule); nothing was "
                    "changed. To pause a queue before its first publish, pass create=1 "
                    "(cluster-dq pause --create)"
                )
        return await self.configure(route, ns, q, [("paused", "1" if paused else "")])

    async def queue_defaults(self, route: PoolRoute[RedisPool], ns: str, q: str) -> QueueSettings:
        """The queue's settings for its default ttr and tries, read at most once per
        ``QueueSettingsCacheSecond`` by this instance (a change made through another one
        applies within that). Pause, max size and backoff are read by the scripts
        themselves, atomically, never from here."""
        hit = self._queue_settings.get((ns, q))
        if hit is not None and time.monotonic() - hit[0] < self.settings.QueueSettingsCacheSecond:
            return hit[1]
        if len(self._queue_settings) > 100_000:
            self._queue_settings.clear()
        return await self.queue_settings(route, ns, q)

    async def list_queues(
        self, route: PoolRoute[RedisPool], ns: str, cursor: str, limit: int
    ) -> tuple[list[tuple[ops.QueueOverview, int]], str]:
        """One page of the namespace's queues, by name after ``cursor`` (the last name of the
        previous page; '' = from the start): each with its overview summed over the pools
        that hold it, and the time of the look. Returns the page and the next cursor ('' =
        done). Names come from the shard registries of every pool of the route, which hold
        every queue with jobs or settings."""
        names: set[str] = set()
        for pool in route.pools():
            shards = pool.engine.config.shards
            op = ops.queues_of_namespace(shards, ns)
            names.update(await self._run(pool, op, idempotent=True))
        ordered = sorted(n for n in names if n > cursor)
        page, more = ordered[:limit], len(ordered) > limit
        out: list[tuple[ops.QueueOverview, int]] = []
        if page:
            by_pool: dict[str, tuple[RedisPool, list[str]]] = {}
            for q in page:
                for pool in route.place(ns, q).reads:
                    by_pool.setdefault(pool.name, (pool, []))[1].append(q)
            merged: dict[str, ops.QueueOverview] = {}
            now = 0
            for pool, qs in by_pool.values():
                now = pool.engine.clock()
                look = ops.overview(pool.engine.config, ns, qs)
                for o in await self._run(pool, look, idempotent=True):
                    merged[o.name] = _merge(merged.get(o.name), o)
            out = [(merged[q], now) for q in page if q in merged]
        return out, page[-1] if more and page else ""


def _merge(a: ops.QueueOverview | None, b: ops.QueueOverview) -> ops.QueueOverview:
    """One queue's overview over the pools that hold it (a migration, a ring moving it)."""
    if a is None:
        return b
    x, y = a.sizes, b.sizes
    events = [t for t in (x.next_event_ms, y.next_event_ms) if t is not None]
    dues = [t for t in (a.oldest_due_ms, b.oldest_due_ms) if t is not None]
    return ops.QueueOverview(
        a.name,
        Sizes(
            x.delayed + y.delayed,
            x.ready + y.ready,
            x.reserved + y.reserved,
            x.dead + y.dead,
            min(events) if events else None,
        ),
        a.paused or b.paused,
        min(dues) if dues else None,
    )
