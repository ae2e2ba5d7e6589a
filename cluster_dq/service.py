"""The use cases: the only thing HTTP handlers call. Routes a request to its pool's engine and
tells the client what a Redis failure means for its request (``PoolUnavailable``), in one
place: ``_unavailable``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from cluster_dq import metrics
from cluster_dq.coalesce import GROUP_MAX, Failed, GroupCommit
from cluster_dq.metrics import Metrics
from cluster_dq.engine import commands as ops
from cluster_dq.engine import schedules as schedule_ops
from cluster_dq.engine import admin as admin_ops
from cluster_dq.engine import control, insight
from cluster_dq.engine.control import DeadFilter
from cluster_dq.engine.core import cancelling
from cluster_dq.firing import carry_settings, move_schedule
from cluster_dq.engine.replies import SweepReply
from cluster_dq.engine.commands import Op, Published, Sizes
from cluster_dq.errors import (
    BadRequest,
    Conflict,
    NotFound,
    NotReplicated,
    PoolUnavailable,
    QueueFull,
    RedisFailure,
    Refused,
    Unauthorized,
)
from cluster_dq.keys import parse_qualified
from cluster_dq.lifecycle import LifecycleLog
from cluster_dq.models import (
    DeadLetter,
    Job,
    JobResult,
    JobSpec,
    JobState,
    id_to_member,
    id_to_text,
    validate_spec,
)
from cluster_dq.pools import RedisPool
from cluster_dq.queueconf import QueueSettings
from cluster_dq.routing import Placement, PoolRoute, build_routes
from cluster_dq.schedules import MAX_SCHEDULE_PAGE, describe
from cluster_dq.schedules import parse as parse_schedule
from cluster_dq.settings import Settings
from cluster_dq.tokens import TokenStore, split_token, well_formed
from cluster_dq.waiters import Look as Look  # (the HTTP layer shares one between two calls)

log = logging.getLogger(__name__)
T = TypeVar("T")


class Service:
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
        self.tokens = TokenStore(pools["default"].engine, settings.TokenCacheSecond, self.routes)
        # One job per request (lmstfy's way): concurrent ones of a queue share a script call.
        self._publishes: GroupCommit[tuple[str, str, str], JobSpec, Published] = GroupCommit(
            self._publish_group, GROUP_MAX
        )
        self._acks: GroupCommit[tuple[str, str, str], str, JobState | None] = GroupCommit(
            self._ack_group, GROUP_MAX
        )
        # (ns, q) -> (monotonic s when read, the queue's settings): its default ttr and tries
        self._queue_settings: dict[tuple[str, str], tuple[float, QueueSettings]] = {}
        self._carried: dict[tuple[str, str, str, str], float] = {}  # see _carry_due

    def route(self, name: str) -> PoolRoute[RedisPool]:
        r = self.routes.get(name)
        if r is None:
            raise NotFound("pool not found")
        return r

    async def _run(
        self, pool: RedisPool, op: Op[T], *, idempotent: bool = False, durable: bool = False
    ) -> T:
        with _unavailable(pool.name, idempotent=idempotent):
            return await pool.engine.run(op, idempotent=idempotent, durable=durable)

    # -- auth -------------------------------------------------------------------------------

    async def authorize(self, raw_token: str | None, ns: str) -> PoolRoute[RedisPool]:
        """``name:token`` or a bare token (``default``) -> the route the name stands for (a pool,
        a migrating pool or a ring), if the token is valid for that namespace."""
        if not raw_token:
            raise Unauthorized("token not found")
        name, token = split_token(raw_token)
        route = self.route(name)
        ok = self.tokens.cached(name, ns, token) if well_formed(name, token) else False
        if ok is None:
            with _unavailable("default", unknown=None, what="token store: "):
                ok = await self.tokens.valid(name, ns, token)
        if not ok:
            raise Unauthorized("invalid token")
        return route

    # -- jobs -------------------------------------------------------------------------------

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
                advice = _not_replicated(cause.of([published]), idempotent=True)
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
        self.metrics.count(metrics.published, ns, q, len(new))
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
        with _unavailable(route.name, unknown=unknown, nothing=NOTHING_RESERVED):
            if len(groups) == 1:
                jobs = await groups[0][0].hub.consume(ns, queues, ttr_ms, count, timeout_ms, look)
            else:
                jobs = await _consume_across(groups, ns, ttr_ms, count, timeout_ms)
        now = route.place(ns, queues[0]).write.engine.clock()
        self.metrics.record_delivered(jobs, now)
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
            with _written_before(len(todo) < len(ids), idempotent=True):
                found = await self._run(pool, op, idempotent=True, durable=True)
            for i, state in zip(todo, found):
                states[i] = state
        self.metrics.count(metrics.acked, ns, q, sum(1 for s in states if s is not None))
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
        self.metrics.count(metrics.acked, ns, q, sum(1 for s in states if s is not None))
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
                self.metrics.count(metrics.released, ns, q, 1)
                self.metrics.count(metrics.dead_lettered, ns, q, state is JobState.DEAD)
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
            with _written_before(True, idempotent=False):  # the old job is acked
                (published,) = await self.publish(route, ns, q, [spec])
            return published
        pool = place.write
        op = ops.republish(pool.engine.config, ns, q, old_id, spec, pool.engine.clock(), lease)
        # Without a lease a repeat is safe (the new job's id is fixed; the old one is gone or
        # acked again). With one, a repeat after a lost reply would find the lease no longer
        # holding the job and answer a conflict for a republish that happened: not repeated.
        acked, published = await self._run(pool, op, idempotent=lease is None, durable=True)
        self.metrics.count(metrics.published, ns, q, not published.duplicate)
        if acked is None and len(place.reads) > 1:  # the old job lives in a pool being drained
            with _written_before(True, idempotent=True):  # the new job is published
                await self.ack(route, ns, q, [old_id])
        else:
            self.metrics.count(metrics.acked, ns, q, acked is not None)
        return published

    # -- per-job control and the dead letter -------------------------------------------------

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

    async def bury(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        job_id: str,
        text: str,
        lease: str | None = None,
    ) -> Job:
        """A reserved, ready or delayed job -> dead letter, reason ``buried``, ``text`` kept as
        its last error; with a ``lease``, only while that delivery holds it."""
        job = await self._on_job(
            route, ns, q, lambda p: control.bury(ns, q, job_id, text, p.engine.clock(), lease)
        )
        self.metrics.count(metrics.dead_lettered, ns, q, 1)
        return job

    async def kick(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        job_id: str,
        delay_ms: int,
        tries: int,
        ttl_ms: int,
    ) -> Job:
        """One dead job back to ready (or delayed by ``delay_ms``), with ``tries`` and a fresh
        ttl."""
        return await self._on_job(
            route,
            ns,
            q,
            lambda p: control.kick(
                p.engine.config, ns, q, job_id, delay_ms, tries, ttl_ms, p.engine.clock()
            ),
        )

    async def reschedule(
        self, route: PoolRoute[RedisPool], ns: str, q: str, job_id: str, due: Callable[[int], int]
    ) -> Job:
        """A ready or delayed job's new due time: ``due(now)`` (ms), now being the clock of
        the pool the job is in."""
        return await self._on_job(
            route,
            ns,
            q,
            lambda p: control.reschedule_job(
                p.engine.config, ns, q, job_id, due(p.engine.clock()), p.engine.clock()
            ),
        )

    async def dead_jobs(
        self, route: PoolRoute[RedisPool], ns: str, q: str, cursor: str | None, limit: int
    ) -> tuple[list[DeadLetter], str | None]:
        """One page of the dead letter, oldest death first, and the cursor of the next (None:
        done). A job that stays dead during a walk is listed exactly once."""
        reads = route.place(ns, q).reads
        index, after, _ = _parse_cursor(cursor, len(reads))
        pool = reads[index]
        page, nxt = await self._run(pool, control.dead_page(ns, q, after, limit), idempotent=True)
        return page, _next_cursor(index, nxt, len(reads))

    async def redrive(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        filt: DeadFilter,
        cursor: str | None,
        limit: int,
        delay_ms: int,
        tries: int,
        ttl_ms: int,
    ) -> tuple[int, str | None]:
        """One bounded step of a filtered redrive: how many moved, and the cursor to go on
        from (None: done). A walk acts on what was dead when it began (``_walk_end``)."""

        def make(pool: RedisPool, filt: DeadFilter, after: control.After | None) -> Op[SweepReply]:
            config, now = pool.engine.config, pool.engine.clock()
            return control.redrive_dead(
                config, ns, q, filt, after, limit, delay_ms, tries, ttl_ms, now
            )

        count, nxt = await self._sweep(route, ns, q, filt, cursor, make, idempotent=False)
        self.metrics.count(metrics.respawned, ns, q, count)
        return count, nxt

    async def purge(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        filt: DeadFilter,
        cursor: str | None,
        limit: int,
    ) -> tuple[int, str | None]:
        """One bounded step of a filtered delete of dead jobs: how many deleted, and the cursor
        to go on from (None: done). Safe to repeat. A walk acts on what was dead when it began."""

        def make(pool: RedisPool, filt: DeadFilter, after: control.After | None) -> Op[SweepReply]:
            return control.purge_dead(ns, q, filt, after, limit)

        return await self._sweep(route, ns, q, filt, cursor, make, idempotent=True)

    async def _sweep(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str,
        filt: DeadFilter,
        cursor: str | None,
        make: Callable[[RedisPool, DeadFilter, control.After | None], Op[SweepReply]],
        idempotent: bool,
    ) -> tuple[int, str | None]:
        """One bounded step of a walk of the dead letter that acts on what it finds (redrive,
        purge): it goes on from ``cursor`` on the read pool the cursor names, acts only on jobs
        dead when the walk began (``_walk_end``), and answers the count and the next cursor."""
        reads = route.place(ns, q).reads
        index, after, end = _parse_cursor(cursor, len(reads))
        filt, end = _walk_end(filt, cursor, end, reads[0].engine.clock())
        pool = reads[index]
        reply = await self._run(pool, make(pool, filt, after), idempotent=idempotent, durable=True)
        nxt = reply.after if reply.more else None
        return reply.count, _next_cursor(index, nxt, len(reads), end)

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

    async def dead_head(self, route: PoolRoute[RedisPool], ns: str, q: str) -> Job | None:
        return await self._first(
            route, ns, q, lambda p: ops.peek(p.engine.config, ns, q, "dead", p.engine.clock())
        )

    async def heads(
        self, route: PoolRoute[RedisPool], ns: str, q: str, state: JobState, limit: int
    ) -> list[Job]:
        """The first ``limit`` ready jobs (delivery order) or delayed jobs (due order) of the
        queue, over the pools that hold it; read-only (the dashboard's look)."""
        out: list[Job] = []
        for pool in route.place(ns, q).reads:
            out += await self._run(pool, ops.heads(ns, q, state, limit), idempotent=True)
        if state is JobState.DELAYED:
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

    async def respawn(
        self, route: PoolRoute[RedisPool], ns: str, q: str, limit: int, ttl_ms: int
    ) -> int:
        n = 0
        for pool in route.place(ns, q).reads:
            if n < limit:
                with _written_before(bool(n), idempotent=False):
                    n += await self._run(
                        pool,
                        ops.respawn(
                            pool.engine.config, ns, q, limit - n, ttl_ms, pool.engine.clock()
                        ),
                    )
        self.metrics.count(metrics.respawned, ns, q, n)
        if self.events and n:
            self.events.record("respawned", ns, q, route.place(ns, q).write.engine.clock(), n=n)
        return n

    async def delete_dead(self, route: PoolRoute[RedisPool], ns: str, q: str, limit: int) -> int:
        n = 0
        for pool in route.place(ns, q).reads:
            if n < limit:
                with _written_before(bool(n), idempotent=False):
                    n += await self._run(pool, ops.delete_dead(ns, q, limit - n))
        return n

    # -- recurring jobs (they live in the queue's write pool, whose pump leaders fire them) ---

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

    # -- queue control ----------------------------------------------------------------------

    async def queue_settings(self, route: PoolRoute[RedisPool], ns: str, q: str) -> QueueSettings:
        """The queue's own settings, as the pool that takes its new jobs holds them."""
        place = route.place(ns, q)
        await self._carry_settings(place, ns, q)
        got = await self._run(place.write, ops.queue_settings(ns, q), idempotent=True)
        self._queue_settings[(ns, q)] = (time.monotonic(), got)
        return got

    async def _carry_settings(self, place: Placement[RedisPool], ns: str, q: str) -> None:
        """A queue that moves (a migration, a ring member added) takes its settings along: a
        pool it moves to that holds none yet gets those of the first pool it is drained from
        that has some, before the queue's first job is written there (its scripts read them:
        pause, max size, backoff). Looked at once per ``QueueSettingsCacheSecond`` per queue
        by each instance, and only while the queue moves; ``configure`` writes every pool.
        (A migrating pool's firer carries them too, with the queue's schedules.)"""
        if len(place.reads) == 1 or not self._carry_due("settings", place, ns, q):
            return
        with _unavailable(place.write.name, idempotent=True):
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
        with _unavailable(place.write.name, idempotent=True):
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

    async def configure(
        self, route: PoolRoute[RedisPool], ns: str, q: str, changes: Sequence[tuple[str, str]]
    ) -> QueueSettings:
        """Changes the queue's own settings (validated: ``queueconf.parse_changes``) on every
        pool that holds its jobs (a migration: the pools drained too, the write pool last),
        and answers them. Idempotent: pause and resume twice change nothing more."""
        got = QueueSettings()
        for i, pool in enumerate(route.place(ns, q).reads):
            with _written_before(i > 0, idempotent=True):
                got = await self._run(pool, ops.configure(ns, q, changes), idempotent=True)
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
        every queue with jobs (a queue without any may be missing)."""
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

    # -- read-only looks for the dashboard's panels -------------------------------------------

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

    # -- admin ------------------------------------------------------------------------------

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


def _parse_cursor(cursor: str | None, pools: int) -> tuple[int, control.After | None, int | None]:
    """A dead-letter cursor: ``<pool index>:<time of death ms>:<job id>`` (the index counts the
    pools the queue is read from: one, but during a migration); ``<index>::`` starts a pool.
    A sweep's (redrive, purge) ends with ``:<end ms>``, the time its walk began."""
    if cursor is None:
        return 0, None, None
    parts = cursor.split(":")
    index = _uint(parts[0]) if len(parts) in (3, 4) else None
    end = _uint(parts[3]) if len(parts) == 4 else None
    if index is None or index >= pools or (len(parts) == 4 and end is None):
        raise BadRequest("invalid cursor", "cursor")
    if parts[1] == "" and parts[2] == "":
        return index, None, end
    score = _uint(parts[1])
    if score is None or not parts[2] or len(parts[2]) > 64:
        raise BadRequest("invalid cursor", "cursor")
    return index, (score, id_to_member(parts[2])), end


def _next_cursor(
    index: int, after: control.After | None, pools: int, end: int | None = None
) -> str | None:
    tail = "" if end is None else f":{end}"
    if after is not None:
        return f"{index}:{after[0]}:{id_to_text(after[1])}{tail}"
    if index + 1 < pools:
        return f"{index + 1}::{tail}"
    return None


def _walk_end(
    filt: control.DeadFilter, cursor: str | None, end: int | None, now: int
) -> tuple[control.DeadFilter, int | None]:
    """A sweep walks what was dead when it began (its first call: ``now``; then the end its
    cursor carries): a job it redrives that dies again meanwhile is not met again, so a walk
    over jobs that keep failing ends."""
    if cursor is None:
        end = now
    if end is None or end >= filt.to_ms:
        return filt, end
    return dataclasses.replace(filt, to_ms=end), end


def _uint(raw: str) -> int | None:
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 20 else None


UNKNOWN = "the request may or may not have been applied"
# Said when nothing of the request can have reached Redis (the client's ``Unavailable`` reads
# "nothing was written" and "repeating it is safe": it repeats even a once-only call).
NOTHING_WRITTEN = (
    "nothing was written (redis refused or could not be reached); repeating it is safe"
)
NOTHING_RESERVED = (
    "nothing was written: no job was reserved for this request (redis refused or could not "
    "be reached); repeating it is safe"
)


@contextlib.contextmanager
def _unavailable(
    pool: str,
    *,
    idempotent: bool = False,
    unknown: str | None = UNKNOWN,
    what: str = "",
    nothing: str = NOTHING_WRITTEN,
) -> Iterator[None]:
    """The one place a Redis failure (the engine's error tree) becomes what the client is told:
    ``PoolUnavailable``, with advice on what may have happened (``unknown``: the advice when
    the outcome is unknown; None: no advice then; ``nothing``: when nothing was written)."""
    try:
        yield
    except NotReplicated as e:
        raise PoolUnavailable(pool, str(e), _not_replicated(e, idempotent)) from e
    except RedisFailure as e:
        if nothing_written(e):
            advice = nothing
        else:
            advice = "" if unknown is None else _outcome(e, idempotent, unknown)
        raise PoolUnavailable(pool, f"{what}{e}", advice) from e


@contextlib.contextmanager
def _written_before(written: bool, *, idempotent: bool) -> Iterator[None]:
    """A step of a request that spans pools (a migration), after an earlier pool's step that
    ``written``: its failure may not say "nothing was written", the request was applied in
    part (a repeat of a once-only one, a respawn, would do its part again)."""
    try:
        yield
    except PoolUnavailable as e:
        if not written or not nothing_written(e):
            raise
        advice = "the request was applied in part (on another pool of the queue); " + (
            "repeating it is safe" if idempotent else "look before repeating it"
        )
        raise PoolUnavailable(e.pool, e.detail, advice) from e


def nothing_written(e: BaseException | None) -> bool:
    """Whether a failure (a ``RedisFailure``, or the ``PoolUnavailable`` made of one) can have
    written nothing: the engine says so, or, where no engine did, the server refused it."""
    if isinstance(e, PoolUnavailable):
        e = e.__cause__
    if not isinstance(e, RedisFailure) or isinstance(e, NotReplicated):
        return False
    return e.nothing_written if e.nothing_written is not None else isinstance(e, Refused)


def _not_replicated(e: NotReplicated, idempotent: bool) -> str:
    result = e.result[1] if isinstance(e.result, tuple) else e.result
    items = result if isinstance(result, list) else [result]
    ids = [p.job_id for p in items if isinstance(p, Published)]
    what = f"job(s) {', '.join(ids)} written" if ids else "the write was applied"
    safe = (
        "repeating the request is safe (publishing with the same job_id is idempotent)"
        if ids
        else "repeating it is safe"
        if idempotent
        else "look the job up before repeating it"
    )
    return f"{what} on the master, but {e}: it may be lost if the master fails now; {safe}"


def _outcome(e: RedisFailure, idempotent: bool, unknown: str) -> str:
    """What a 503 tells the client of its request (when something may have been written)."""
    if nothing_written(e):
        return NOTHING_WRITTEN
    if idempotent:
        return "the request may have been applied; repeating it is safe"
    return unknown


async def _consume_across(
    groups: list[tuple[RedisPool, list[str]]], ns: str, ttr_ms: int, count: int, timeout_ms: int
) -> list[Job]:
    """A consume whose queues live on several pools (a ring, a migration): look at each pool
    at once, pools being drained first; if all are empty, long-poll all of them and take what
    the first one delivers. Jobs beyond ``count`` (two pools delivered at the same moment) are
    given back at once, without spending a try."""
    jobs: list[Job] = []
    taken: list[tuple[RedisPool, list[Job]]] = []  # what the first look reserved, by pool
    unreachable: list[Refused] = []  # pools the first look could not reach (nothing reserved)
    try:
        for pool, qs in groups:
            try:
                got = await pool.hub.consume(ns, qs, ttr_ms, count - len(jobs), 0)
            except Refused as e:  # the others may have jobs; the long poll looks again
                unreachable.append(e)
                continue
            taken.append((pool, got))
            jobs += got
            if len(jobs) >= count:
                return jobs
    except asyncio.CancelledError:  # the consumer left: give back what it will never get
        for pool, got in taken:
            _give_back_later(pool, ns, got)
        raise
    if jobs or timeout_ms <= 0:
        if not jobs and unreachable:
            raise unreachable[0]
        return jobs
    tasks = {
        asyncio.create_task(pool.hub.consume(ns, qs, ttr_ms, count, timeout_ms)): pool
        for pool, qs in groups
    }
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(not t.exception() and t.result() for t in done):
                break
    finally:
        for t in tasks:
            t.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:  # cancelled meanwhile: the tasks still end on their own
            pass
        if cancelling():  # the consumer left: what a pool delivered goes back, try unspent
            for t, pool in tasks.items():
                t.add_done_callback(functools.partial(_give_back_delivered, pool, ns))
            raise asyncio.CancelledError()
    errors: list[BaseException] = []
    by_pool: list[tuple[RedisPool, list[Job]]] = []
    for t, pool in tasks.items():
        if t.cancelled():
            continue
        if t.exception() is not None:
            errors.append(t.exception())  # type: ignore[arg-type]
        elif t.result():
            by_pool.append((pool, t.result()))
    for pool, got in by_pool:
        keep = got[: count - len(jobs)]
        jobs += keep
        await pool.hub.give_back(ns, got[len(keep) :])
    if not jobs and errors:
        raise errors[0]
    return jobs


def _give_back_delivered(pool: RedisPool, ns: str, task: asyncio.Task[list[Job]]) -> None:
    if not task.cancelled() and task.exception() is None:
        _give_back_later(pool, ns, task.result())


def _give_back_later(pool: RedisPool, ns: str, jobs: list[Job]) -> None:
    """Jobs of a consumer that is gone: back to ready in the background (the hub awaits it
    on close), without spending a try."""
    if jobs:
        pool.hub._background(pool.hub.give_back(ns, jobs))
