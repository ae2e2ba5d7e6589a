"""Giving reserved jobs back: a job reserved for a consumer who will never get it (it left, a
multi-pool consume took another pool's jobs, its consume was cancelled with the reply in
flight) goes back to ready at once, without spending a try, instead of sitting out its ttr."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.errors import Conflict
from cluster_dq.models import Job


async def give_back(engine: AsyncEngine, namespace: str, jobs: Sequence[Job]) -> None:
    """Each job with the lease of the reservation given back, so a repeat (after a lost reply)
    cannot take the job from a consumer who reserved it meanwhile."""
    by_queue: dict[str, list[Job]] = {}
    for j in jobs:
        by_queue.setdefault(j.queue, []).append(j)
    for q, held in by_queue.items():
        ids, leases = [j.job_id for j in held], [j.lease for j in held]
        op = ops.release(engine.config, namespace, q, ids, 0, engine.clock(), leases=leases)
        try:
            await engine.run(op, idempotent=True)
        except Conflict:  # held by another delivery by now, or its ttr ran out: leave it
            pass


async def give_back_when_done(
    engine: AsyncEngine, namespace: str, task: asyncio.Future[list[Job]]
) -> None:
    """What ``task`` (a consume whose caller was cancelled) reserved, once its reply comes."""
    try:
        jobs = await task
    except Exception:  # nothing was reserved, or the outcome is unknown: the ttr decides
        return
    await give_back(engine, namespace, jobs)
