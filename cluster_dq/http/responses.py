"""JSON shapes of lmstfy's API: the job object and errors."""

from __future__ import annotations

import base64
from typing import Any

from starlette.responses import JSONResponse, Response

import json as _json

from cluster_dq.models import Job, JobResult


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
    if job.lease is not None:
        out["lease"] = job.lease  # this delivery's token: send it back on ack, touch, release
    if job.progress is not None:
        out["progress"] = _json.loads(job.progress)
    return out


def result_object(done: JobResult) -> dict[str, Any]:
    """A job acked with a result, while the result is kept."""
    return {
        "namespace": done.namespace,
        "queue": done.queue,
        "job_id": done.job_id,
        "state": "acked",
        "result": _json.loads(done.result),
        "acked_at_ms": done.done_ms,
    }


def json(data: Any, status: int = 200) -> Response:
    return JSONResponse(data, status_code=status)


def error(message: str, status: int, key: str = "error") -> Response:
    return JSONResponse({key: message}, status_code=status)
