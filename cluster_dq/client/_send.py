"""How the worker sends one job's outcome or heartbeat: the request for each outcome, always
with the delivery's lease, and what became of it (done, ``lost``: the lease no longer holds
the job, ``failed``: the service did not confirm it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from cluster_dq import tracing
from cluster_dq.client._async.client import AsyncClient
from cluster_dq.client.errors import Conflict, DQError, NotFound, TransportError, Unavailable
from cluster_dq.client.models import Job
from cluster_dq.client.outcomes import Acked, Outcome, Released, Snoozed

log = logging.getLogger("cluster_dq.worker")


async def send_outcome(client: AsyncClient, job: Job, outcome: Outcome) -> str:
    """Sends ``outcome`` (a plain ack is the batcher's, not this): returns its name
    (``acked``, ``released``, ``snoozed``, ``buried``), or ``lost`` or ``failed``. While
    tracing, its settle spans are children of the job's process span."""
    with tracing.after_process(job.id):
        return await _send(client, job, outcome)


async def _send(client: AsyncClient, job: Job, outcome: Outcome) -> str:
    lease = job.lease
    if isinstance(outcome, Acked):
        sent = await _call(client.ack, job, lease=lease, result=outcome.result)
        return sent or "acked"
    if isinstance(outcome, Snoozed):
        sent = await _call(
            client.release,
            job,
            lease=lease,
            delay=outcome.delay,
            error=outcome.error,
            keep_try=True,
        )
        return sent or "snoozed"
    if isinstance(outcome, Released):
        sent = await _call(
            client.release, job, lease=lease, delay=outcome.delay, error=outcome.error
        )
        return sent or "released"
    sent = await _call(client.bury, job, lease=lease, reason=outcome.reason)
    return sent or "buried"


async def _call(verb: Callable[..., Awaitable[Any]], job: Job, **kw: Any) -> str:
    """One settling request: '' when done. Repeated after an unknown outcome (with a lease,
    a repeat cannot touch a later delivery; a conflict then means the first one applied)."""
    unknown = False
    for pause in (0.1, 0.5, 2.0, None):
        try:
            await verb(job.queue, job.id, **kw)
            return ""
        except (Conflict, NotFound) as e:
            if unknown and job.lease:
                return ""
            log.warning("job %s of %s: %s", job.id, job.queue, e)
            return "lost"
        except (TransportError, Unavailable) as e:
            if not job.lease or pause is None:
                log.error("job %s of %s: outcome not confirmed: %s", job.id, job.queue, e)
                return "failed"
            unknown = True
            await asyncio.sleep(pause)
        except DQError as e:
            log.error("job %s of %s: refused: %s", job.id, job.queue, e)
            return "failed"
    return "failed"


async def renew(client: AsyncClient, job: Job, ttr: float) -> str:
    """A heartbeat: touches the job with its lease. '' when renewed, ``lost`` when the job
    was taken back, ``again`` when it could not be said (tried again on the next beat)."""
    try:
        await client.touch(job.queue, job.id, lease=job.lease, ttr=ttr)
    except (Conflict, NotFound) as e:
        log.warning("job %s of %s taken back, will not be acked: %s", job.id, job.queue, e)
        return "lost"
    except DQError as e:
        log.warning("touch of job %s of %s failed (tried again): %s", job.id, job.queue, e)
        return "again"
    return ""
