"""The use cases: the only thing HTTP handlers call. Routes a request to its pool's engine and
translates Redis failures into ``PoolUnavailable`` (503) at this boundary."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypeVar

from redis.exceptions import RedisError

from cluster_dq import metrics
from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import NotReplicated
from cluster_dq.engine.commands import Op, Published, Sizes
from cluster_dq.errors import NotFound, PoolUnavailable, Unauthorized
from cluster_dq.keys import parse_qualified, shard_of
from cluster_dq.lifecycle import LifecycleLog
from cluster_dq.models import Job, JobSpec, JobState, validate_spec
from cluster_dq.pools import RedisPool
from cluster_dq.settings import Settings
from cluster_dq.tokens import TokenStore, split_token

log = logging.getLogger(__name__)
T = TypeVar("T")


class Service:
    def __init__(self, settings: Settings, pools: dict[str, RedisPool], events: LifecycleLog | None = None) -> None:
        self.settings = settings
        self.pools = pools
        self.events = events
        self.tokens = TokenStore(pools["default"].engine, settings.TokenCacheSecond)

    def pool(self, name: str) -> RedisPool:
        p = self.pools.get(name)
        if p is None:
            raise NotFound("pool not found")
        return p

    async def _run(self, pool: RedisPool, op: Op[T], *, idempotent: bool = False, durable: bool = False) -> T:
        try:
            return await pool.engine.run(op, idempotent=idempotent, durable=durable)
        except NotReplicated as e:
            result = e.result[1] if isinstance(e.result, tuple) else e.result
            items = result if isinstance(result, list) else [result]
            ids = [p.job_id for p in items if isinstance(p, Published)]
            what = f"job(s) {', '.join(ids)} written" if ids else "the write was applied"
            raise PoolUnavailable(pool.name, (
                f"{what} on the master, but {e}: it may be lost if the master fails now; "
                "repeating the request is safe (publishing with the same job_id is idempotent)"
            )) from e  # fmt: skip
        except (RedisError, OSError) as e:
            raise PoolUnavailable(pool.name, f"{type(e).__name__}: {e}") from e

    # -- auth -------------------------------------------------------------------------------

    async def authorize(self, raw_token: str | None, ns: str) -> tuple[RedisPool, str]:
        """``pool:token`` or a bare token (pool ``default``) -> the pool, if the token is valid
        for that namespace."""
        if not raw_token:
            raise Unauthorized("token not found")
        pool_name, token = split_token(raw_token)
        pool = self.pool(pool_name)
        try:
            ok = await self.tokens.valid(pool_name, ns, token)
        except (RedisError, OSError) as e:
            raise PoolUnavailable("default", f"token store: {e}") from e
        if not ok:
            raise Unauthorized("invalid token")
        return pool, token

    # -- jobs -------------------------------------------------------------------------------

    async def publish(self, pool: RedisPool, ns: str, q: str, specs: Sequence[JobSpec]) -> list[Published]:
        for spec in specs:
            validate_spec(spec)  # all-or-nothing: refuse before writing anything
        cfg = pool.engine.config
        # Safe to retry: the job ids are fixed before the first attempt.
        now = now_ms()
        out = await self._run(pool, ops.publish(cfg, ns, q, specs, now), idempotent=True, durable=True)
        metrics.count(metrics.published, ns, q, sum(1 for p in out if not p.duplicate))
        if self.events:
            self.events.published(ns, q, now, [p.job_id for p in out if not p.duplicate])
        return out

    async def consume(
        self, pool: RedisPool, ns: str, queues: Sequence[str], ttr_ms: int, count: int, timeout_ms: int
    ) -> list[Job]:
        try:
            jobs = await pool.hub.consume(ns, queues, ttr_ms, count, timeout_ms)
        except (RedisError, OSError) as e:
            raise PoolUnavailable(pool.name, f"{type(e).__name__}: {e}") from e
        now = now_ms()
        metrics.record_delivered(jobs, now)
        if self.events:
            self.events.delivered(jobs, now)
        return jobs

    async def ack(self, pool: RedisPool, ns: str, q: str, ids: Sequence[str]) -> list[JobState | None]:
        states = await self._run(pool, ops.ack(ns, q, ids), idempotent=True, durable=True)
        metrics.count(metrics.acked, ns, q, sum(1 for s in states if s is not None))
        if self.events:
            self.events.acked(ns, q, now_ms(), [i for i, s in zip(ids, states) if s is not None])
        return states

    async def republish(
        self, pool: RedisPool, ns: str, q: str, old_id: str, spec: JobSpec
    ) -> Published:
        validate_spec(spec)
        op = ops.republish(pool.engine.config, ns, q, old_id, spec, now_ms())
        acked, published = await self._run(pool, op, idempotent=True, durable=True)
        metrics.count(metrics.acked, ns, q, acked is not None)
        metrics.count(metrics.published, ns, q, not published.duplicate)
        return published

    async def peek(self, pool: RedisPool, ns: str, q: str) -> Job:
        job = await self._run(pool, ops.peek(pool.engine.config, ns, q, "ready", now_ms()), idempotent=True)
        if job is None:
            raise NotFound("the queue is empty")
        return job

    async def peek_job(self, pool: RedisPool, ns: str, q: str, job_id: str) -> Job:
        job = await self._run(pool, ops.peek_job(ns, q, job_id), idempotent=True)
        if job is None:
            raise NotFound("job not found")
        return job

    async def sizes(self, pool: RedisPool, ns: str, q: str) -> Sizes:
        return await self._run(pool, ops.sizes(pool.engine.config, ns, q), idempotent=True)

    async def destroy(self, pool: RedisPool, ns: str, q: str) -> int:
        return await self._run(pool, ops.destroy(pool.engine.config, ns, q), idempotent=True)

    async def dead_head(self, pool: RedisPool, ns: str, q: str) -> Job | None:
        return await self._run(pool, ops.peek(pool.engine.config, ns, q, "dead", now_ms()), idempotent=True)

    async def respawn(self, pool: RedisPool, ns: str, q: str, limit: int, ttl_ms: int) -> int:
        n = await self._run(pool, ops.respawn(pool.engine.config, ns, q, limit, ttl_ms, now_ms()))
        metrics.count(metrics.respawned, ns, q, n)
        if self.events and n:
            self.events.record("respawned", ns, q, now_ms(), n=n)
        return n

    async def delete_dead(self, pool: RedisPool, ns: str, q: str, limit: int) -> int:
        return await self._run(pool, ops.delete_dead(ns, q, limit))

    # -- admin ------------------------------------------------------------------------------

    async def info(self, pool: RedisPool) -> dict[str, list[str]]:
        """``{namespace: [queues]}`` from the shard registries."""
        out: dict[str, list[str]] = {}
        for shard in range(pool.engine.config.shards):
            for qualified in await self._run(pool, ops.queues_of_shard(shard), idempotent=True):
                ns, q = parse_qualified(qualified)
                out.setdefault(ns, []).append(q)
        return {ns: sorted(qs) for ns, qs in sorted(out.items())}

    def shard(self, pool: RedisPool, ns: str, q: str) -> int:
        return shard_of(f"{ns}/{q}", pool.engine.config.shards)
