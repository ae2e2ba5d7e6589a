"""The data port's OpenAPI document, put together from the operations each concept module
declares beside its handlers (``http/jobs.py``, ``delivery.py``, ``queues.py``,
``deadletter.py``, ``schedules.py``, ``control.py``, ``workers.py``), with the token's write limit on the
requests it counts (``http/throttle.py``)."""

from __future__ import annotations

from dataclasses import replace

from cluster_dq.http.control import control_operations
from cluster_dq.http.deadletter import dead_letter_operations
from cluster_dq.http.delivery import delivery_operations
from cluster_dq.http.guard import TOKEN
from cluster_dq.http.jobs import job_operations
from cluster_dq.http.openapi import ACK, PROGRESS, RELEASE, TOUCH, Op, Schema, document, error
from cluster_dq.http.queues import queue_operations
from cluster_dq.http.groups import group_operations
from cluster_dq.http.schedules import SCHEDULE_PATH, schedule_operations
from cluster_dq.http.workers import WORKERS_PATH, worker_operations
from cluster_dq.settings import Settings


def data_document(s: Settings) -> Schema:
    return document("data", with_write_limits(data_operations(s)), TOKEN)


# The order the document lists the operations in, as it always has (a client or a reviewer
# diffing two versions' documents sees only what changed); a route not listed here comes last.
ORDER = [
    tuple(line.split())
    for line in """
    PUT /api/{ns}/{q}
    PUT /api/{ns}/{q}/bulk
    PUT /api/{ns}/{q}/job/{job_id}
    GET /api/{ns}/{queues}
    DELETE /api/{ns}/{q}/job/{job_id}
    POST /api/{ns}/{q}/ack
    POST /api/{ns}/{q}/job/{job_id}/touch
    POST /api/{ns}/{q}/job/{job_id}/release
    GET /api/{ns}/{q}/peek
    GET /api/{ns}/{q}/job/{job_id}
    PUT /api/{ns}/{q}/job/{job_id}/progress
    GET /api/{ns}/{q}/size
    DELETE /api/{ns}/{q}
    GET /api/{ns}/{q}/deadletter
    PUT /api/{ns}/{q}/deadletter
    DELETE /api/{ns}/{q}/deadletter
    GET /api/{ns}/{q}/deadletter/size
    GET /api/{ns}/{q}/schedules
    PUT /api/{ns}/{q}/schedules/{name}
    GET /api/{ns}/{q}/schedules/{name}
    DELETE /api/{ns}/{q}/schedules/{name}
    POST /api/{ns}/{q}/schedules/{name}/pause
    POST /api/{ns}/{q}/schedules/{name}/resume
    POST /api/{ns}/{q}/job/{job_id}/bury
    POST /api/{ns}/{q}/job/{job_id}/reschedule
    POST /api/{ns}/{q}/deadletter/{job_id}/kick
    GET /api/{ns}/{q}/deadletter/jobs
    POST /api/{ns}/{q}/deadletter/redrive
    POST /api/{ns}/{q}/deadletter/purge
    GET /api/{ns}/{q}/settings
    PATCH /api/{ns}/{q}/settings
    PUT /api/{ns}/{q}/settings
    POST /api/{ns}/{q}/pause
    POST /api/{ns}/{q}/resume
    GET /api/{ns}/{q}/groups
    GET /api/{ns}/{q}/groups/{group}
    PATCH /api/{ns}/{q}/groups/{group}
    PUT /api/{ns}/{q}/groups/{group}
    POST /api/{ns}/{q}/groups/{group}/pause
    POST /api/{ns}/{q}/groups/{group}/resume
    GET /api/{ns}
    """.strip().splitlines()
]


def data_operations(s: Settings) -> list[Op]:
    """Every route of the data port (``DataAPI.routes``), with what it can answer."""
    ops = [
        *job_operations(s),
        *delivery_operations(s),
        *queue_operations(s),
        *group_operations(),
        *dead_letter_operations(s),
        *schedule_operations(s),
        *control_operations(s),
        *worker_operations(s),
    ]
    place = {key: i for i, key in enumerate(ORDER)}
    return sorted(ops, key=lambda op: place.get((op.method, op.path), len(place)))


# Requests that change a queue but are not counted against the token's write limit: they finish
# a delivery its consume counted (docs/api.md#rate-limits). Every other one but a GET is.
NOT_COUNTED = {
    ACK,
    TOUCH,
    RELEASE,
    PROGRESS,
    ("/api/{ns}/{q}/ack", "post"),
    (WORKERS_PATH + "/{worker_id}", "put"),  # a worker's bookkeeping, as an ack is
    (WORKERS_PATH + "/{worker_id}", "delete"),
}
E429_WRITE = error(
    "the token's write limit: nothing was changed",
    "token(01M84CYQJ90007ZG2JKZ9W9AQM) produce reach the limit rate, please retry later",
    "Message",
)
E403_WRITE = error(
    "the token has a write limit: a schedule would publish past it; nothing was written",
    "token(01M84CYQJ90007ZG2JKZ9W9AQM) has a write limit: a schedule would publish past it",
)


def with_write_limits(ops: list[Op]) -> list[Op]:
    """Every counted write may answer the token's 429; creating, replacing or resuming a
    schedule, a token with a write limit's 403."""
    starts_schedule = ((SCHEDULE_PATH, "put"), (SCHEDULE_PATH + "/resume", "post"))
    out = []
    for op in ops:
        key = (op.path, op.method.lower())
        if op.method not in ("GET", "HEAD") and key not in NOT_COUNTED:
            extra = {403: E403_WRITE} if key in starts_schedule else {}
            op = replace(op, responses={429: E429_WRITE, **extra, **op.responses})
        out.append(op)
    return out
