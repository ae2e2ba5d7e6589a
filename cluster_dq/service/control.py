"""Per-job control and the dead letter: bury, kick and reschedule one job by id; list, redrive,
purge, respawn and delete dead jobs, the walks going page by page with a cursor."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from cluster_dq import metrics, names
from cluster_dq.engine import commands as ops
from cluster_dq.engine import control
from cluster_dq.engine.commands import Op
from cluster_dq.engine.control import DeadFilter
from cluster_dq.engine.replies import SweepReply
from cluster_dq.errors import BadRequest
from cluster_dq.models import DeadLetter, Job, id_to_member, id_to_text
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.service.core import ServiceCore
from cluster_dq.service.failures import written_before


class JobControl(ServiceCore):
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
        self.metrics.count(metrics.dead_lettered, ns, q, 1, route.place(ns, q).write.name)
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
        index, after, _ = _parse_cursor(cursor, len(reads), sweep=False)
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

    async def dead_head(self, route: PoolRoute[RedisPool], ns: str, q: str) -> Job | None:
        return await self._first(
            route, ns, q, lambda p: ops.peek(p.engine.config, ns, q, "dead", p.engine.clock())
        )

    async def respawn(
        self, route: PoolRoute[RedisPool], ns: str, q: str, limit: int, ttl_ms: int
    ) -> int:
        n = 0
        for pool in route.place(ns, q).reads:
            if n < limit:
                with written_before(bool(n), idempotent=False):
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
                with written_before(bool(n), idempotent=False):
                    n += await self._run(pool, ops.delete_dead(ns, q, limit - n))
        return n


def _parse_cursor(
    cursor: str | None, pools: int, sweep: bool = True
) -> tuple[int, control.After | None, int | None]:
    """A dead-letter cursor: ``<pool index>:<time of death ms>:<job id>`` (the index counts the
    pools the queue is read from: one, but during a migration); ``<index>::`` starts a pool.
    A ``sweep``'s (redrive, purge) ends with ``:<end ms>``, the time its walk began."""
    if cursor is None:
        return 0, None, None
    parts = cursor.split(":")
    index = _uint(parts[0]) if len(parts) in ((3, 4) if sweep else (3,)) else None
    end = _uint(parts[3]) if len(parts) == 4 else None
    if index is None or index >= pools or (len(parts) == 4 and end is None):
        raise BadRequest("invalid cursor", "cursor")
    if parts[1] == "" and parts[2] == "":
        return index, None, end
    score = _uint(parts[1])
    if score is None or names.job_id(parts[2]):
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


SKEW_MS = 86_400_000  # how far ahead of this instance's clock a walk's start may be: a day


def _walk_end(
    filt: control.DeadFilter, cursor: str | None, end: int | None, now: int
) -> tuple[control.DeadFilter, int | None]:
    """A sweep walks what was dead when it began (its first call: ``now``; then the end its
    cursor carries): a job it redrives that dies again meanwhile is not met again, so a walk
    over jobs that keep failing ends."""
    if cursor is None:
        end = now
    elif end is not None and end > now + SKEW_MS:  # begun a day from now: no cursor of ours
        raise BadRequest("invalid cursor", "cursor")
    elif end is not None:  # (begun by an instance whose clock runs a little ahead: up to now)
        end = min(end, now)
    if end is None or end >= filt.to_ms:
        return filt, end
    return dataclasses.replace(filt, to_ms=end), end


def _uint(raw: str) -> int | None:
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 20 else None
