"""The core every use case runs on: a request's route (pool, migrating pool or ring) to the
pools that hold a queue, a step run on a pool's engine with its failures translated
(``failures.py``), the fan-out of a per-job step over the pools a queue's jobs may be in, and
what a moving queue carries along (its settings and schedules)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from cluster_dq.engine import schedules as schedule_ops
from cluster_dq.engine.commands import Op
from cluster_dq.errors import Conflict, NotFound
from cluster_dq.firing import carry_settings, move_schedule
from cluster_dq.lifecycle import LifecycleLog
from cluster_dq.metrics import Metrics
from cluster_dq.models import Job
from cluster_dq.pools import RedisPool
from cluster_dq.routing import Placement, PoolRoute, build_routes
from cluster_dq.schedules import MAX_SCHEDULE_PAGE
from cluster_dq.service.failures import unavailable
from cluster_dq.settings import Settings
from cluster_dq.tokens import TokenStore

T = TypeVar("T")


class ServiceCore:
    """The state every use case shares (``Service`` is them all, over this)."""

    def __init__(
        self,
        settings: Settings,
        pools: dict[str, RedisPool],
        events: LifecycleLog | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics.from_settings(settings)
        self.pools = pools
        self.routes = build_routes(settings, pools)
        self.events = events
        self._tokens = TokenStore(pools["default"].engine, settings.TokenCacheSecond, self.routes)
        self._carried: dict[tuple[str, str, str, str], float] = {}  # see _carry_due

    def route(self, name: str) -> PoolRoute[RedisPool]:
        r = self.routes.get(name)
        if r is None:
            raise NotFound("pool not found")
        return r

    async def _run(
        self, pool: RedisPool, op: Op[T], *, idempotent: bool = False, durable: bool = False
    ) -> T:
        with unavailable(pool.name, idempotent=idempotent):
            return await pool.engine.run(op, idempotent=idempotent, durable=durable)

    async def _on_job(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        make: Callable[[RedisPool], Op[T | None]],
        *,
        idempotent: bool = False,
        durable: bool = True,
        missing: str = "job not found",
    ) -> T:
        """Runs a per-job operation on each pool the queue's jobs may be in (one, but during a
        migration) until one finds the job (an answer that is neither None nor False);
        ``NotFound`` (``missing``) when none does. A ``Conflict`` saying the job is in no state
        there moves on to the next pool. Moves (bury, kick, reschedule) are not idempotent: a
        repeat after a lost reply would find the job moved and answer 409 for a move that
        happened."""
        reads = route.place(ns, q).reads
        for pool in reads:
            try:
                got = await self._run(pool, make(pool), idempotent=idempotent, durable=durable)
            except Conflict as e:
                if e.state is None and pool is not reads[-1]:
                    continue  # not in this pool (a migration): it may be in the next
                raise
            if got is not None and got is not False:
                return got
        raise NotFound(missing)

    async def _first(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        make: Callable[[RedisPool], Op[Job | None]],
    ) -> Job | None:
        for pool in route.place(ns, q).reads:
            job = await self._run(pool, make(pool), idempotent=True)
            if job is not None:
                return job
        return None

    async def _carry_settings(self, place: Placement[RedisPool], ns: str, q: str) -> None:
        """A queue that moves (a migration, a ring member added) takes its settings along: a
        pool it moves to that holds none yet gets those of the first pool it is drained from
        that has some, before the queue's first job is written there (its scripts read them:
        pause, max size, backoff). Looked at once per ``QueueSettingsCacheSecond`` per queue
        by each instance, and only while the queue moves; ``configure`` writes every pool.
        (A migrating pool's firer carries them too, with the queue's schedules.)"""
        if len(place.reads) == 1 or not self._carry_due("settings", place, ns, q):
            return
        with unavailable(place.write.name, idempotent=True):
            for pool in place.reads[:-1]:
                if await carry_settings(pool.engine, place.write.engine, ns, q):
                    break

    async def _carry_schedules(self, place: Placement[RedisPool], ns: str, q: str) -> None:
        """A queue that moves takes its schedules along (``firing.move_schedule``), with its
        settings: before a request reads or changes them on the pool it moves to. A migrating
        pool's firer moves those with a timer anyway; this also moves paused ones, and one
        that a request would otherwise put beside a copy still firing in the old pool."""
        if len(place.reads) == 1 or not self._carry_due("schedules", place, ns, q):
            return
        with unavailable(place.write.name, idempotent=True):
            for pool in place.reads[:-1]:
                cursor = 0
                while True:
                    cursor, found = await pool.engine.run(
                        schedule_ops.page(ns, q, cursor, MAX_SCHEDULE_PAGE), idempotent=True
                    )
                    for schedule, _ in found:
                        await move_schedule(pool.engine, place.write.engine, ns, q, schedule.name)
                    if cursor == 0:
                        break

    def _carry_due(self, what: str, place: Placement[RedisPool], ns: str, q: str) -> bool:
        """Whether this instance looks again at what a moving queue carries (once per
        ``QueueSettingsCacheSecond``)."""
        key = (what, place.write.name, ns, q)
        seen = self._carried.get(key)
        if seen is not None and time.monotonic() - seen < self.settings.QueueSettingsCacheSecond:
            return False
        if len(self._carried) > 100_000:
            self._carried.clear()
        self._carried[key] = time.monotonic()
        return True
