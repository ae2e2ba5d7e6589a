"""What operators and the dashboard look at: the delayed timeline of a queue, the pump leaders,
the audit log, the queues of a route, what a migration still drains, the pools' readiness and
topology (where each queue lives, who leads each pump shard)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.crc import key_slot

from cluster_dq.engine import admin as admin_ops
from cluster_dq.engine import commands as ops
from cluster_dq.engine import insight
from cluster_dq.engine.commands import Sizes
from cluster_dq.engine.insight import Leader
from cluster_dq.errors import ClusterDQError, NotFound
from cluster_dq.keys import QueueKeys, parse_qualified, shard_of
from cluster_dq.pools import RedisPool, Topology, describe
from cluster_dq.routing import PoolRoute
from cluster_dq.service.core import ServiceCore


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one queue lives: pool, pump shard (and its leader), Cluster slot and node."""

    pool: str
    namespace: str
    queue: str
    shard: int
    slot: int | None
    node: str
    leader: str


@dataclass(frozen=True, slots=True)
class PoolView:
    topology: Topology
    leaders: list[Leader]
    mine: str  # this worker's pump token in that pool ('' when it runs no pump)
    queues: list[Placement]
    error: str = ""


MAX_QUEUES = 500


class Operators(ServiceCore):
    async def delayed_span(
        self, route: PoolRoute[RedisPool], ns: str, q: str
    ) -> insight.DelayedSpan | None:
        """Earliest and latest due time of the queue's delayed jobs, over the pools holding it."""
        spans = [
            s
            for p in route.place(ns, q).reads
            if (s := await self._run(p, insight.delayed_span(ns, q), idempotent=True))
        ]
        if not spans:
            return None
        return insight.DelayedSpan(min(s.first_ms for s in spans), max(s.last_ms for s in spans))

    async def delayed_counts(
        self, route: PoolRoute[RedisPool], ns: str, q: str, edges: Sequence[int]
    ) -> insight.DelayedCounts:
        """Delayed jobs per due-time bin between ``edges`` (``insight.delayed_counts``)."""
        counts, outside, unread = [0] * (len(edges) - 1), 0, 0
        for pool in route.place(ns, q).reads:
            got = await self._run(pool, insight.delayed_counts(ns, q, edges), idempotent=True)
            counts = [a + b for a, b in zip(counts, got.counts)]
            outside, unread = outside + got.outside, unread + got.unread
        return insight.DelayedCounts(counts, outside, unread)

    async def delayed_between(
        self, route: PoolRoute[RedisPool], ns: str, q: str, start: int, end: int, limit: int
    ) -> list[insight.DelayedJob]:
        """Up to ``limit`` delayed jobs due in ``[start, end)``, soonest first."""
        out: list[insight.DelayedJob] = []
        for pool in route.place(ns, q).reads:
            op = insight.delayed_between(ns, q, start, end, limit)
            out += await self._run(pool, op, idempotent=True)
        return sorted(out, key=lambda j: (j.due_ms, j.job_id))[:limit]

    async def pump_leaders(self, pool_name: str) -> list[insight.Leader]:
        """Each shard's pump lease in the pool: who holds it, for how long, its epoch."""
        pool = self.pools.get(pool_name)
        if pool is None:
            raise NotFound("pool not found")
        op = insight.leaders(pool.engine.config.shards)
        return await self._run(pool, op, idempotent=True)

    async def record_audit(self, pool: str, entry: str, cap: int) -> None:
        """Appends one audit entry (JSON) to ``pool``'s audit log, kept to ``cap`` entries.
        Not repeated: a repeat after a lost reply would log the change twice."""
        target = self.pools.get(pool) or self.pools["default"]
        await self._run(target, admin_ops.audit_append(entry, cap))

    async def audit_log(self, limit: int) -> list[str]:
        """The newest ``limit`` audit entries (JSON) of every pool, each pool's newest first."""
        out: list[str] = []
        for pool in self.pools.values():
            out += await self._run(pool, admin_ops.audit_entries(limit), idempotent=True)
        return out

    async def info(self, route: PoolRoute[RedisPool]) -> dict[str, list[str]]:
        """``{namespace: [queues]}`` from the shard registries of every pool of the route."""
        out: dict[str, set[str]] = {}
        for pool in route.pools():
            for shard in range(pool.engine.config.shards):
                for qualified in await self._run(pool, ops.queues_of_shard(shard), idempotent=True):
                    ns, q = parse_qualified(qualified)
                    out.setdefault(ns, set()).add(q)
        return {ns: sorted(qs) for ns, qs in sorted(out.items())}

    async def draining(self, route: PoolRoute[RedisPool]) -> dict[str, dict[str, Sizes]]:
        """For a migrating pool or a ring with ``PreviousPools``: the queues that still hold
        jobs on a pool they are being drained from, by pool. Empty: the migration is done."""
        out: dict[str, dict[str, Sizes]] = {}
        for pool in route.pools():
            for shard in range(pool.engine.config.shards):
                for qualified in await self._run(pool, ops.queues_of_shard(shard), idempotent=True):
                    ns, q = parse_qualified(qualified)
                    if not any(p is pool for p in route.place(ns, q).reads[:-1]):
                        continue  # not being drained from this pool
                    s = await self._run(pool, ops.sizes(pool.engine.config, ns, q), idempotent=True)
                    if s.delayed or s.ready or s.reserved or s.dead:
                        out.setdefault(pool.name, {})[qualified] = s
        return out

    async def readiness(self) -> dict[str, dict[str, bool | str]]:
        """Each pool's state as ``RedisPool.ready`` says it (Redis reached, scripts loaded)."""
        return {name: await pool.ready() for name, pool in self.pools.items()}

    async def topology(self, most: int = MAX_QUEUES) -> list[PoolView]:
        """Every pool: its kind (and Sentinel master, or Cluster nodes with their slot ranges), the
        pump leader of each shard, and where its queues live (at most ``most`` per pool)."""
        views = []
        for name, pool in sorted(self.pools.items()):
            topo = await describe(pool)
            mine = pool.pump.token if pool.pump else ""
            try:
                leaders = await self.pump_leaders(name)
                listed = await self.info(self.route(name))
            except ClusterDQError as e:
                views.append(PoolView(topo, [], mine, [], str(e)))
                continue
            holder = {lead.shard: lead.holder for lead in leaders}
            queues: list[Placement] = []
            for ns, qs in listed.items():
                for q in qs:
                    if len(queues) >= most:
                        break
                    qk = QueueKeys(ns, q)
                    shard = shard_of(qk.qualified, pool.engine.config.shards)
                    slot = key_slot(qk.meta.encode()) if topo.kind == "cluster" else None
                    node = topo.owner(slot) if slot is not None else topo.master
                    queues.append(Placement(name, ns, q, shard, slot, node, holder.get(shard, "")))
            views.append(PoolView(topo, leaders, mine, queues))
        return views
