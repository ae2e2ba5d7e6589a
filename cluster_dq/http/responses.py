"""JSON shapes of lmstfy's API: the job object and errors."""

from __future__ import annotations

import base64
from typing import Any

from starlette.responses import JSONResponse, Response

from cluster_dq import userjson
from cluster_dq.models import UNKNOWN_REASON, DeadLetter, Job, JobResult


def job_object(job: Job, now: int, *, msg: bool = True) -> dict[str, Any]:
    ttl = 0
    if job.expire_at_ms:
        ttl = max((job.expire_at_ms - now + 999) // 1000, 1)  # never "0 = forever" by rounding
    out: dict[str, Any] = {
        "namespace": job.namespace,
        "queue": job.queue,
        "job_id": job.job_id,
        "data": base64.b64encode(job.body).decode(),
        "ttl": ttl,
        "elapsed_ms": max(now - job.published_ms, 0),
        "remain_tries": job.tries_left,
        "attributes": job.attributes,
    }
    if msg:
        out = {"msg": "new job", **out}
    if job.state is not None:
        out["state"] = str(job.state)
    out["deliveries"] = job.deliveries
    if job.state == "delayed" and job.deliveries and job.due_ms is not None:
        out["next_attempt_at"] = job.due_ms  # waiting out a retry backoff (or a release delay)
    note = job.note
    if job.state == "dead":  # why and when it died (a death recorded before notes: unknown)
        out["reason"] = note.reason if note else UNKNOWN_REASON
        out["died_at"] = note.died_ms if note and note.died_ms else job.due_ms
        out["last_error"] = note.last_error if note else None
    elif note is not None and note.last_error is not None:
        out["last_error"] = note.last_error
    if job.lease is not None:
        out["lease"] = job.lease  # this delivery's token: send it back on ack, touch, release
    if job.progress is not None:
        out["progress"] = userjson.stored(job.progress)
    if job.dedup_key is not None:
        out["dedup_key"] = job.dedup_key  # (a lookup by id: the key it holds, or held)
    if job.group is not None:
        out["group"] = job.group  # absent for a job without one: lmstfy's shape unchanged
    return out


def result_object(done: JobResult) -> dict[str, Any]:
    """A job acked with a result, while the result is kept."""
    return {
        "namespace": done.namespace,
        "queue": done.queue,
        "job_id": done.job_id,
        "state": "acked",
        "result": userjson.stored(done.result),
        "acked_at_ms": done.done_ms,
    }


def json(data: Any, status: int = 200) -> Response:
    return JSONResponse(data, status_code=status)


def error(message: str, status: int, key: str = "error") -> Response:
    return JSONResponse({key: message}, status_code=status)


def dead_letter_object(d: DeadLetter) -> dict[str, Any]:
    out: dict[str, Any] = {
        "job_id": d.job_id,
        "reason": d.reason,
        "died_at": d.died_ms,
        "deliveries": d.deliveries,
        "last_error": d.last_error,
        "size": d.size,
        "published_at": d.published_ms,
    }
    if d.attributes:
        out["attributes"] = d.attributes
    return out
