"""The data port's spans, with ``EnableTracing`` only (the app has no such middleware
otherwise, so tracing off costs nothing): one span of kind SERVER per messaging request,
named as the client's (``cluster_dq/tracing.py``): ``send`` (publish, bulk publish),
``receive`` (consume), ``settle`` (ack, batch ack, release, bury), a child of the request's
``traceparent`` when it has one. What only the answer says (the published job's id, the jobs
a consume delivered, linked to their producers) is read from it; other requests pass through
untouched."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster_dq import tracing

# A reply larger than this (a consume of many large jobs) is not read for its ids and links.
MAX_READ = 1024 * 1024

# (method, segments after /api/, the one naming the route) -> (operation type, operation name)
_ROUTES: dict[tuple[str, int, str], tuple[str, str]] = {
    ("PUT", 2, ""): ("send", "publish"),
    ("PUT", 3, "bulk"): ("send", "publish"),
    ("GET", 2, ""): ("receive", "consume"),
    ("DELETE", 4, "job"): ("settle", "ack"),
    ("POST", 3, "ack"): ("settle", "ack"),
    ("POST", 5, "release"): ("settle", "release"),
    ("POST", 5, "bury"): ("settle", "bury"),
}


def operation(scope: Scope) -> tuple[str, str, str, str, str | None] | None:
    """(type, name, namespace, queue or queues, job id) of a messaging request, else None."""
    path: str = scope["path"]
    if scope["type"] != "http" or not path.startswith("/api/"):
        return None
    parts = path[5:].split("/")
    if len(parts) < 2 or not all(parts) or parts[1] == "_workers":
        return None
    n = len(parts)
    if n in (2, 3):
        tail = parts[2] if n == 3 else ""
    elif n in (4, 5) and parts[2] == "job":
        tail = parts[4] if n == 5 else "job"
    else:
        return None
    found = _ROUTES.get((scope["method"], n, tail))
    if found is None:
        return None
    op_type, op_name = found
    if op_name == "release" and b"keep_try=1" in scope.get("query_string", b""):
        op_name = "snooze"
    job_id = parts[3] if len(parts) >= 4 else None
    return op_type, op_name, parts[0], parts[1], job_id


class TracedRoutes:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = operation(scope)
        if found is None:
            await self.app(scope, receive, send)
            return
        op_type, op_name, ns, queues, job_id = found
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        status, body = 0, bytearray()
        reading = op_type != "settle"

        async def sending(message: Message) -> None:
            nonlocal status, reading
            if message["type"] == "http.response.start":
                status = message["status"]
                reading = reading and status < 300
            elif reading and message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                reading = len(body) <= MAX_READ
            await send(message)

        with tracing.server_span(headers, op_type, op_name, ns, queues, job_id) as span:
            await self.app(scope, receive, sending)
            span.set(tracing.STATUS_CODE, status)
            if status >= 500:
                span.failed(str(status))
            elif reading and body:
                _answered(span, op_type, bytes(body))


def _answered(span: tracing.Span, op_type: str, body: bytes) -> None:
    """What the answer of a publish or a consume says: the job ids, the jobs' producers."""
    try:
        reply = json.loads(body)
    except ValueError:
        return
    if op_type == "send":
        if isinstance(reply.get("job_ids"), list):
            span.set(tracing.BATCH_COUNT, len(reply["job_ids"]))
        elif isinstance(reply.get("job_id"), str):
            span.message(reply["job_id"])
        return
    jobs = reply if isinstance(reply, list) else [reply]
    span.jobs([_Delivered(o) for o in jobs if isinstance(o, dict)], isinstance(reply, list))


class _Delivered:
    """A job object of a consume's answer, as ``tracing.Traced.jobs`` reads it."""

    def __init__(self, o: dict[str, Any]) -> None:
        self.id = str(o.get("job_id"))
        attributes = o.get("attributes")
        self.attributes: Mapping[str, str] | None = (
            attributes if isinstance(attributes, dict) else None
        )
