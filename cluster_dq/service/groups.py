"""A queue's groups: one group's sizes and settings, a page of the groups that hold jobs, and
changes to a group's pause, concurrency limit and rate limit (``engine/groups.py``)."""

from __future__ import annotations

from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import Group, GroupChanges
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.service.core import ServiceCore
from cluster_dq.service.failures import written_before


def _merged(a: Group, b: Group) -> Group:
    """One group over two pools (a queue moving between them): counts add up; the settings
    are the write pool's (``b``), which ``configure_group`` writes last."""
    return Group(
        a.name,
        a.size + b.size,
        a.reserved + b.reserved,
        a.held + b.held,
        b.paused,
        b.concurrency,
        b.rate,
    )


class Groups(ServiceCore):
    async def group(self, route: PoolRoute[RedisPool], ns: str, q: str, group: str) -> Group:
        """One group (all zero, no setting: a group nothing was written to)."""
        found: Group | None = None
        for pool in route.place(ns, q).reads:
            (g,) = await self._run(pool, ops.describe_groups(ns, q, [group]), idempotent=True)
            found = g if found is None else _merged(found, g)
        assert found is not None
        return found

    async def groups(
        self, route: PoolRoute[RedisPool], ns: str, q: str, cursor: int, count: int
    ) -> tuple[int, list[Group]]:
        """A page of the groups holding jobs in the pool that takes the queue's new jobs."""
        pool = route.place(ns, q).write
        return await self._run(pool, ops.list_groups(ns, q, cursor, count), idempotent=True)

    async def configure_group(
        self, route: PoolRoute[RedisPool], ns: str, q: str, group: str, changes: GroupChanges
    ) -> Group:
        """Changes a group's settings on every pool holding the queue (the write pool last) and
        answers the group. Idempotent: the same change twice changes nothing more, but for a
        rate limit, which starts afresh."""
        out: Group | None = None
        for i, pool in enumerate(route.place(ns, q).reads):
            op = ops.configure_group(pool.engine.config, ns, q, group, changes, pool.engine.clock())
            with written_before(i > 0, idempotent=True):
                g = await self._run(pool, op, idempotent=True)
            out = g if out is None else _merged(out, g)
        assert out is not None
        return out
