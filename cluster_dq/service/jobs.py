"""Jobs: publish, consume, ack, release, touch, progress and republish, one job per request or
many. Concurrent one-job publishes and acks of a queue share one script call (group commit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cluster_dq import metrics
from cluster_dq.coalesce import GROUP_MAX, Failed, GroupCommit
from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import KeyedPublished, KeyedRequest, Published
from cluster_dq.errors import Conflict, NotFound, NotReplicated, PoolUnavailable, QueueFull
from cluster_dq.models import (
    Dedup,
    Idempotency,
    Job,
    JobSpec,
    JobState,
    validate_keys,
    validate_spec,
)
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.service.core import ServiceCore
from cluster_dq.service.failures import (
    NOTHING_RESERVED,
    not_replicated,
    nothing_written,
    unavailable,
    written_before,
)
from cluster_dq.service.longpoll import consume_across
from cluster_dq.waiters import Look


class Jobs(ServiceCore):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One job per request (lmstfy's way): concurrent ones of a queue share a script call.
        self._publishes: GroupCommit[tuple[str, str, str], JobSpec, Published] = GroupCommit(
            self._publish_group, GROUP_MAX
        )
        self._acks: GroupCommit[tuple[str, str, str], str, JobState | None] = GroupCommit(
            self._ack_group, GROUP_MAX
        )
        # One-job publishes under a key (a dedup key, an Idempotency-Key): the same, each
        # request done in turn in the shared call, as if alone.
        self._keyed: GroupCommit[tuple[str, str, str], KeyedRequest, KeyedPublished] = GroupCommit(
            self._keyed_group, GROUP_MAX
        )

    async def publish(
        self, route: PoolRoute[RedisPool], ns: str, q: str, specs: Sequence[JobSpec]
    ) -> list[Published]:
        for spec in specs:
            validate_spec(spec)  # all-or-nothing: refuse before writing anything
        place = route.place(ns, q)
        pool = place.write
        if len(specs) == 1 and len(place.reads) == 1:
            return [await self._publishes.submit((pool.name, ns, q), specs[0])]
        await self._carry_settings(place, ns, q)
        # A client id held by a pool being drained is a duplicate, as it would be on one pool.
        known = await self._known_elsewhere(place.reads[:-1], ns, q, specs)
        fresh = [s for s in specs if s.job_id not in known] if known else specs
        # one request's jobs: all or none of them when the queue's max_size would be passed
        out = await self._publish_on(pool, ns, q, fresh, whole=True) if fresh else []
        if any(p.full for p in out):
            raise QueueFull(ns, q)
        if known:
            done = iter(out)
            return [
                Published(s.job_id, True, None) if s.job_id in known else next(done) for s in specs
            ]
        return out

    async def publish_keyed(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        specs: Sequence[JobSpec],
        dedup: Dedup | None,
        idem: Idempotency | None,
    ) -> KeyedPublished:
        """A publish under a dedup key (one job) or an Idempotency-Key (one job or a bulk),
        all or none of the jobs. Concurrent one-job ones of a queue share a script call (group
        commit); a bulk has one of its own. On a queue moving between pools, the keys are
        looked up in the pool written to only."""
        for spec in specs:
            validate_spec(spec)
        validate_keys(specs, dedup, idem)
        place = route.place(ns, q)
        request = KeyedRequest(specs, dedup, idem)
        if len(specs) == 1 and len(place.reads) == 1:
            return await self._keyed.submit((place.write.name, ns, q), request)
        if len(place.reads) > 1:
            await self._carry_settings(place, ns, q)
        (out,) = await self._keyed_on(place.write, ns, q, [request])
        if isinstance(out, Failed):
            raise out.error
        return out

    async def _keyed_group(
        self, key: tuple[str, str, str], requests: list[KeyedRequest]
    ) -> list[KeyedPublished]:
        pool_name, ns, q = key
        # (a Failed member: its own error, which GroupCommit raises for it alone)
        told: list[Any] = await self._keyed_on(self.pools[pool_name], ns, q, requests)
        return told

    async def _keyed_on(
        self, pool: RedisPool, ns: str, q: str, requests: Sequence[KeyedRequest]
    ) -> list[KeyedPublished | Failed]:
        now = pool.engine.clock()
        op = ops.publish_keyed_many(pool.engine.config, ns, q, requests, now)
        # Safe to retry: the ids are fixed before the first attempt, and a repeat finds its
        # own job under the dedup key, or its own answer under the Idempotency-Key.
        done = await self._run(pool, op, idempotent=True, durable=True)
        told: list[KeyedPublished | Failed] = []
        new: list[str] = []
        for out in done:
            if isinstance(out, Exception):
                told.append(Failed(out))
                continue
            if not out.replayed and out.dedup in (None, "new"):
                new += [p.job_id for p in out.published if not p.duplicate]
            told.append(out)
        self.metrics.count(metrics.published, ns, q, len(new), pool.name)
        if self.events and new:
            self.events.published(ns, q, now, new)
        return told

    async def _publish_group(
        self, key: tuple[str, str, str], specs: list[JobSpec]
    ) -> list[Published]:
        pool_name, ns, q = key
        try:
            done = await self._publish_on(self.pools[pool_name], ns, q, specs)
            # job by job: each request of the group is told of its own (QueueFull: 429)
            told: list[Any] = [Failed(QueueFull(ns, q)) if p.full else p for p in done]
            return told
        except PoolUnavailable as e:
            cause = e.__cause__
            if len(specs) == 1 or not isinstance(cause, NotReplicated):
                raise
            # Written but not confirmed: each request is told of its own job, not the batch's.
            out: list[Any] = []
            for published in cause.result:
                advice = not_replicated(cause.of([published]), idempotent=True)
                out.append(Failed(PoolUnavailable(pool_name, e.detail, advice)))
            return out

    async def _publish_on(
        self, pool: RedisPool, ns: str, q: str, specs: Sequence[JobSpec], whole: bool = False
    ) -> list[Published]:
        # Safe to retry: the job ids are fixed before the first attempt.
        now = pool.engine.clock()
        op = ops.publish(pool.engine.config, ns, q, specs, now, whole)
        out = await self._run(pool, op, idempotent=True, durable=True)
        new = [p.job_id for p in out if not p.duplicate and not p.full]
        self.metrics.count(metrics.published, ns, q, len(new), pool.name)
        if self.events:
            self.events.published(ns, q, now, new)
        return out

    async def _known_elsewhere(
        self, drained: Sequence[RedisPool], ns: str, q: str, specs: Sequence[JobSpec]
    ) -> set[str]:
        ids = [s.job_id for s in specs if s.job_id is not None]
        known: set[str] = set()
        for pool in drained if ids else ():
            cfg = pool.engine.config
            op = ops.known_ids(ns, q, ids, pool.engine.clock(), cfg.remember_acked_ms)
            found = await self._run(pool, op, idempotent=True)
            known.update(i for i, k in zip(ids, found) if k)
        return known

    async def consume(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        queues: Sequence[str],
        ttr_ms: int,
        count: int,
        timeout_ms: int,
        look: Look | None = None,
    ) -> list[Job]:
        """``look``: shared by a request's first look (timeout 0) and its long-poll after it,
        which then need not look again (``WaiterHub.consume``); queues on one pool only."""
        groups = route.groups(ns, queues)
        unknown = (
            "jobs may have been reserved for this request and not delivered; "
            "they are delivered again once their ttr ends"
        )
        with unavailable(route.name, unknown=unknown, nothing=NOTHING_RESERVED):
            if len(groups) == 1:
                jobs = await groups[0][0].hub.consume(ns, queues, ttr_ms, count, timeout_ms, look)
            else:
                jobs = await consume_across(groups, ns, ttr_ms, count, timeout_ms)
        now = route.place(ns, queues[0]).write.engine.clock()
        self.metrics.record_delivered(jobs, now, lambda q: route.place(ns, q).write.name)
        if self.events:
            self.events.delivered(jobs, now)
        return jobs

    async def ack(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        ids: Sequence[str],
        leases: Sequence[str | None] | None = None,
        results: Sequence[bytes | None] | None = None,
    ) -> list[JobState | None]:
        """Acks jobs in any state; the state each was in (None: not found). With ``leases``
        (aligned with ``ids``): if one does not hold its job, ``Conflict`` and nothing acked.
        ``results`` (aligned with ``ids``, JSON or None): kept ``ResultSecond`` after the ack
        for each job found (an ack with one goes outside the group commit)."""
        reads = route.place(ns, q).reads
        if len(ids) == 1 and not leases and not results and len(reads) == 1:
            return [await self._acks.submit((reads[0].name, ns, q), ids[0])]
        states: list[JobState | None] = [None] * len(ids)
        now = 0
        if leases and len(reads) > 1:  # all or nothing across the pools too: check them all first
            for pool in reads:
                check = ops.ack(ns, q, ids, pool.engine.clock(), 0, leases, check_only=True)
                await self._run(pool, check, idempotent=True)
        for pool in reads:  # a job is in one of them; usually there is one
            todo = [i for i, s in enumerate(states) if s is None]
            if not todo:
                break
            now = pool.engine.clock()
            op = ops.ack(
                ns,
                q,
                [ids[i] for i in todo],
                now,
                pool.engine.config.remember_acked_ms,
                [leases[i] for i in todo] if leases else None,
                results=[results[i] for i in todo] if results else None,
                keep_result_ms=pool.engine.config.keep_result_ms,
            )
            with written_before(len(todo) < len(ids), idempotent=True):
                found = await self._run(pool, op, idempotent=True, durable=True)
            for i, state in zip(todo, found):
                states[i] = state
        acked = sum(1 for s in states if s is not None)
        self.metrics.count(metrics.acked, ns, q, acked, route.place(ns, q).write.name)
        if self.events:
            self.events.acked(ns, q, now, [i for i, s in zip(ids, states) if s is not None])
        return states

    async def _ack_group(self, key: tuple[str, str, str], ids: list[str]) -> list[JobState | None]:
        """Acks without leases of one queue, from concurrent requests (group commit)."""
        pool_name, ns, q = key
        pool = self.pools[pool_name]
        now = pool.engine.clock()
        op = ops.ack(ns, q, ids, now, pool.engine.config.remember_acked_ms, None)
        states = await self._run(pool, op, idempotent=True, durable=True)
        self.metrics.count(metrics.acked, ns, q, sum(1 for s in states if s is not None), pool_name)
        if self.events:
            self.events.acked(ns, q, now, [i for i, s in zip(ids, states) if s is not None])
        return states

    async def release(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        job_id: str,
        delay_ms: int,
        lease: str | None = None,
        error: str = "",
        keep_try: bool = False,
    ) -> JobState | str:
        """A consumer's nack: the reserved job goes back now or after ``delay_ms``, its
        delivery counted (no tries left: dead letter); with ``keep_try`` (a snooze) the
        delivery is not counted and its try is restored, so the job never dies of it; with a
        ``lease``, only while that delivery holds it (else ``Conflict``). Not repeated by the retry policy: once the job
        is back, another consumer may hold it, and a blind repeat would release *that*
        reservation (or, with a lease, answer a conflict for a release that happened). A reply
        lost in transit is a 503 that says the release may have happened. ``error``: a text
        kept as the job's last error."""
        reads = route.place(ns, q).reads
        for pool in reads:
            op = ops.release(
                pool.engine.config,
                ns,
                q,
                [job_id],
                delay_ms,
                pool.engine.clock(),
                nack=not keep_try,
                leases=[lease],
                error=error,
            )
            try:
                (state,) = await self._run(pool, op, durable=True)
            except Conflict as e:
                if e.state is None and pool is not reads[-1]:
                    continue  # not in this pool (a migration): it may be in the next
                raise
            except PoolUnavailable as e:
                if nothing_written(e):
                    raise  # it says so, and that repeating is safe
                raise PoolUnavailable(
                    pool.name,
                    e.detail,
                    (
                        "the release may have been applied: look the job up "
                        f"(GET /api/{ns}/{q}/job/{job_id}) before repeating it"
                    ),
                ) from e
            if state is not None:
                self.metrics.count(metrics.released, ns, q, 1, pool.name)
                self.metrics.count(metrics.dead_lettered, ns, q, state is JobState.DEAD, pool.name)
                self.metrics.count(metrics.ttl_expired, ns, q, state == "expired")
                return state
        raise NotFound("job is not reserved")

    async def touch(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        job_id: str,
        ttr_ms: int,
        lease: str | None = None,
    ) -> None:
        """Moves the reservation's deadline to now + ``ttr_ms`` (a consumer still working)."""
        await self._on_job(
            route,
            ns,
            q,
            lambda p: ops.touch(p.engine.config, ns, q, job_id, ttr_ms, p.engine.clock(), lease),
            idempotent=True,
            missing="job is not reserved",
        )

    async def progress(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        job_id: str,
        value: bytes,
        lease: str | None = None,
    ) -> JobState:
        """Records a reserved job's progress (JSON, checked by the caller), replacing the last:
        with a ``lease``, while that delivery holds the job; without, while the job is in a
        running reservation. ``Conflict`` (where the job is) otherwise, ``NotFound`` when there
        is no such job. Safe to repeat: the same value is written again."""
        await self._on_job(
            route,
            ns,
            q,
            lambda p: ops.progress(ns, q, job_id, value, p.engine.clock(), lease),
            idempotent=True,
            durable=False,
        )
        return JobState.RESERVED

    async def republish(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        old_id: str,
        spec: JobSpec,
        lease: str | None = None,
    ) -> Published:
        validate_spec(spec)
        place = route.place(ns, q)
        if lease is not None and len(place.reads) > 1:
            # A migration: the old job may live in a pool being drained, and the new one goes
            # to the write pool; no one script spans both. The lease is checked where the job
            # is (ack), then the new job is published.
            (state,) = await self.ack(route, ns, q, [old_id], [lease])
            if state is None:
                raise Conflict([(old_id, None)])
            with written_before(True, idempotent=False):  # the old job is acked
                (published,) = await self.publish(route, ns, q, [spec])
            return published
        pool = place.write
        op = ops.republish(pool.engine.config, ns, q, old_id, spec, pool.engine.clock(), lease)
        # Without a lease a repeat is safe (the new job's id is fixed; the old one is gone or
        # acked again). With one, a repeat after a lost reply would find the lease no longer
        # holding the job and answer a conflict for a republish that happened: not repeated.
        acked, published = await self._run(pool, op, idempotent=lease is None, durable=True)
        self.metrics.count(metrics.published, ns, q, not published.duplicate, pool.name)
        if acked is None and len(place.reads) > 1:  # the old job lives in a pool being drained
            with written_before(True, idempotent=True):  # the new job is published
                await self.ack(route, ns, q, [old_id])
        else:
            self.metrics.count(metrics.acked, ns, q, acked is not None, pool.name)
        return published
