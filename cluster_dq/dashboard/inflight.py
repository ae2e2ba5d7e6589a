"""A queue's in-flight list: its reserved jobs, soonest ttr deadline first, each with its
lease and, when a worker announced it (``service/workers.py``), the worker holding it and since
when. Bounded: the first ``IN_FLIGHT`` jobs; the page says how many more are reserved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster_dq.models import Job, JobState
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.service import Service

IN_FLIGHT = 50  # reserved jobs a queue page lists


@dataclass(frozen=True, slots=True)
class Held:
    job: Job  # reserved: ``due_ms`` is its ttr deadline, ``lease`` its delivery's
    worker_id: str | None  # the worker that announced it holds the job (None: no worker did)
    host: str | None
    started_ms: int | None  # when that worker began on it


async def in_flight(
    service: Service, route: PoolRoute[RedisPool], ns: str, q: str, limit: int = IN_FLIGHT
) -> list[Held]:
    """The queue's first ``limit`` reserved jobs with their holders; the namespace's worker
    registry is read only when some job is reserved."""
    jobs = await service.heads(route, ns, q, JobState.RESERVED, limit)
    if not jobs:
        return []
    workers, _ = await service.list_workers(route, ns)
    holders: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for w in workers:
        for held in w.get("in_flight") or []:
            if held.get("queue") == q:
                holders[held["job_id"]] = (w, held)
    out = []
    for job in jobs:
        worker, held = holders.get(job.job_id, ({}, {}))
        out.append(Held(job, worker.get("worker_id"), worker.get("host"), held.get("started_ms")))
    return out
