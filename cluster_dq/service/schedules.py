"""Recurring jobs: they live in the queue's write pool, whose pump leaders fire them."""

from __future__ import annotations

from typing import Any

from cluster_dq.engine import schedules as schedule_ops
from cluster_dq.errors import NotFound
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.schedules import describe
from cluster_dq.schedules import parse as parse_schedule
from cluster_dq.service.core import ServiceCore


class Schedules(ServiceCore):
    async def _schedules_pool(self, route: PoolRoute[RedisPool], ns: str, q: str) -> RedisPool:
        """The pool that holds the queue's schedules (its write pool), those of a pool it is
        moving from brought over first."""
        place = route.place(ns, q)
        await self._carry_schedules(place, ns, q)
        return place.write

    async def put_schedule(
        self, route: PoolRoute[RedisPool], ns: str, q: str, name: str, body: bytes
    ) -> tuple[dict[str, Any], bool]:
        """Creates or replaces a schedule: (the schedule as answered, whether it was new)."""
        pool = await self._schedules_pool(route, ns, q)
        now = pool.engine.clock()
        s = self.settings
        schedule, paused = parse_schedule(
            name, body, s.TTLSecond * 1000, s.TriesNum, now, s.MaxBodyBytes
        )
        op = schedule_ops.put(pool.engine.config, ns, q, schedule, paused, now)
        state, created = await self._run(pool, op, idempotent=True)
        return describe(ns, q, schedule, state), created

    async def schedule(
        self, route: PoolRoute[RedisPool], ns: str, q: str, name: str
    ) -> dict[str, Any]:
        pool = await self._schedules_pool(route, ns, q)
        found = await self._run(pool, schedule_ops.get(ns, q, name), idempotent=True)
        if found is None:
            raise NotFound("schedule not found")
        return describe(ns, q, *found)

    async def schedules(
        self, route: PoolRoute[RedisPool], ns: str, q: str, cursor: int, limit: int
    ) -> tuple[int, list[dict[str, Any]]]:
        pool = await self._schedules_pool(route, ns, q)
        nxt, found = await self._run(pool, schedule_ops.page(ns, q, cursor, limit), idempotent=True)
        return nxt, [describe(ns, q, *item) for item in found]

    async def pause_schedule(
        self, route: PoolRoute[RedisPool], ns: str, q: str, name: str, paused: bool
    ) -> dict[str, Any]:
        pool = await self._schedules_pool(route, ns, q)
        op = schedule_ops.set_paused(pool.engine.config, ns, q, name, paused, pool.engine.clock())
        return describe(ns, q, *(await self._run(pool, op, idempotent=True)))

    async def delete_schedule(
        self, route: PoolRoute[RedisPool], ns: str, q: str, name: str
    ) -> None:
        pool = await self._schedules_pool(route, ns, q)
        await self._run(pool, schedule_ops.delete(pool.engine.config, ns, q, name), idempotent=True)
