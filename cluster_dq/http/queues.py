"""A queue as a whole (lmstfy's size and destroy; as extensions, its own settings, pause and
resume) and a namespace's queues, a page at a time. The routes, their handlers and their
OpenAPI declarations."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cluster_dq import queueconf
from cluster_dq.backoff import KINDS, MAX_BACKOFF_MS
from cluster_dq.http import params
from cluster_dq.http.guard import GUARDED, Handlers
from cluster_dq.http.openapi import (
    E413,
    INT,
    NAME,
    NO_CONTENT,
    NS,
    Q,
    SIZE,
    Op,
    Schema,
    error,
    json_body,
    obj,
    param,
    reply,
    uint,
)
from cluster_dq.http.params import MAX_LIST
from cluster_dq.http.responses import json
from cluster_dq.models import MAX_SECONDS, MAX_TRIES
from cluster_dq.queueconf import MAX_SIZE
from cluster_dq.settings import Settings


class QueuesAPI(Handlers):
    async def size(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        s = await self.service.sizes(route, ns, q)
        return json(
            {
                "namespace": ns,
                "queue": q,
                "size": s.ready,
                "delayed": s.delayed,
                "reserved": s.reserved,
                "dead": s.dead,
            }
        )

    async def destroy(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        await self.service.destroy(route, ns, q)
        return Response(status_code=204)

    async def settings(self, request: Request) -> Response:
        """A queue's own settings: read (GET) or changed (PATCH, PUT: the fields given)."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        if request.method in ("GET", "HEAD"):
            got = await self.service.queue_settings(route, ns, q)
        else:
            data = await params.body(request, 64 * 1024)
            got = await self.service.configure(route, ns, q, queueconf.parse_changes(data))
        return json({"namespace": ns, "queue": q, **got.as_json()})

    async def pause(self, request: Request) -> Response:
        """Pause (``/pause``) or resume (``/resume``) a queue; idempotent; its settings. A queue
        that does not exist is a 404 unless ``create=1``."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        paused = request.url.path.endswith("/pause")
        create = params.flag(params.query(request), "create")
        got = await self.service.pause(route, ns, q, paused, create)
        return json({"namespace": ns, "queue": q, **got.as_json()})

    async def queues(self, request: Request) -> Response:
        """The namespace's queues, a page at a time (by name), with sizes and lateness."""
        ns = request.path_params["ns"]
        route = await self.auth(request, ns)
        qp = params.query(request)
        limit = params.bounded(qp, "limit", 100, 1, params.MAX_LIST)
        page, nxt = await self.service.list_queues(route, ns, params.cursor(qp), limit)
        out = []
        for o, now in page:
            s = o.sizes
            out.append(
                {
                    "queue": o.name,
                    "ready": s.ready,
                    "delayed": s.delayed,
                    "reserved": s.reserved,
                    "dead": s.dead,
                    "paused": o.paused,
                    "oldest_due_ms": o.oldest_due_ms,
                    "lateness_ms": None if o.oldest_due_ms is None else now - o.oldest_due_ms,
                }
            )
        return json({"namespace": ns, "queues": out, "cursor": nxt})

    def routes(self) -> list[Route]:
        write = self.write  # counted against the token's write limit
        return [
            Route("/api/{ns}/{q}/settings", write(self.settings), methods=["GET", "PATCH", "PUT"]),
            Route("/api/{ns}/{q}/pause", write(self.pause), methods=["POST"]),
            Route("/api/{ns}/{q}/resume", write(self.pause), methods=["POST"]),
            Route("/api/{ns}/{q}/size", self.size, methods=["GET"]),
            Route("/api/{ns}/{q}", write(self.destroy), methods=["DELETE"]),
            Route("/api/{ns}", self.queues, methods=["GET"]),
        ]


# -- the OpenAPI declarations ---------------------------------------------------------------


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def queue_operations(s: Settings) -> list[Op]:
    """The routes of ``QueuesAPI.routes``, with what they can answer."""
    ms = {"type": "integer", "minimum": 1, "maximum": MAX_SECONDS * 1000}
    settings_schema = obj(
        ["namespace", "queue", "paused", "ttr_ms", "tries", "max_size"]
        + ["backoff", "backoff_ms", "backoff_cap_ms", "backoff_jitter"],
        namespace={"type": "string"},
        queue={"type": "string"},
        paused={"type": "boolean"},
        ttr_ms={"type": ["integer", "null"], "minimum": 1},
        tries={"type": ["integer", "null"], "minimum": 1, "maximum": MAX_TRIES},
        max_size={"type": ["integer", "null"], "minimum": 1},
        backoff={"enum": ["fixed", "exponential", None]},
        backoff_ms={"type": ["integer", "null"], "minimum": 0},
        backoff_cap_ms={"type": ["integer", "null"], "minimum": 0},
        backoff_jitter={"type": ["number", "null"], "minimum": 0, "maximum": 1},
    )
    example = {
        "namespace": "demo",
        "queue": "orders",
        "paused": False,
        "ttr_ms": None,
        "tries": 3,
        "max_size": 100000,
        "backoff": "exponential",
        "backoff_ms": 1000,
        "backoff_cap_ms": 60000,
        "backoff_jitter": 0.2,
    }
    the_settings = reply("the queue's settings (null: not set)", settings_schema, example)
    backoff_ms = {"type": "integer", "minimum": 0, "maximum": MAX_BACKOFF_MS}
    changes = {
        "type": "object",
        "description": "the settings to change; null removes one; a backoff is given whole",
        "properties": {
            "paused": {"type": "boolean"},
            "ttr_ms": nullable(ms),
            "tries": nullable({"type": "integer", "minimum": 1, "maximum": MAX_TRIES}),
            "max_size": nullable({"type": "integer", "minimum": 1, "maximum": MAX_SIZE}),
            "backoff": {"enum": [*KINDS, None]},
            "backoff_ms": nullable(backoff_ms),
            "backoff_cap_ms": nullable(backoff_ms),
            "backoff_jitter": nullable({"type": "number", "minimum": 0, "maximum": 1}),
        },
        "additionalProperties": False,
    }
    body = json_body(
        changes,
        {"max_size": 100000, "tries": 3, "backoff": "exponential", "backoff_ms": 1000},
        required=False,
    )
    change = {**GUARDED, 200: the_settings, 413: E413}
    listed = obj(
        ["queue", "ready", "delayed", "reserved", "dead", "paused"]
        + ["oldest_due_ms", "lateness_ms"],
        queue={"type": "string"},
        ready=INT,
        delayed=INT,
        reserved=INT,
        dead=INT,
        paused={"type": "boolean"},
        oldest_due_ms={
            "type": ["integer", "null"],
            "description": "the due time of the head of the ready set; null: nothing ready",
        },
        lateness_ms={"type": ["integer", "null"], "description": "how long ago that was"},
    )
    unknown_queue = error(
        "the queue does not exist (no job, settings or schedule), or the pool is unknown; "
        "nothing was written",
        "queue demo/ordres not found (no job, settings or schedule); nothing was changed. …",
    )
    create = uint(
        "create", "1: the queue need not exist yet (a pause before its first publish)", 0, 1
    )
    return [
        Op(
            "GET",
            "/api/{ns}/{q}/settings",
            "The queue's own settings",
            {**GUARDED, 200: the_settings},
            [NS, Q],
            tag="queue control",
        ),
        *(
            Op(
                method,
                "/api/{ns}/{q}/settings",
                "Change the queue's settings: the fields given (400 naming a bad one, and "
                "nothing changes)",
                change,
                [NS, Q],
                body,
                tag="queue control",
            )
            for method in ("PATCH", "PUT")
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/pause",
            "Pause the queue: publishes still accepted, consumes get nothing from it",
            {**GUARDED, 200: the_settings, 404: unknown_queue},
            [NS, Q, create],
            tag="queue control",
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/resume",
            "Resume the queue (wakes waiting long-polls)",
            {**GUARDED, 200: the_settings, 404: unknown_queue},
            [NS, Q, create],
            tag="queue control",
        ),
        Op(
            "GET",
            "/api/{ns}",
            "The namespace's queues, by name, a page at a time, with sizes and lateness",
            {
                **GUARDED,
                200: reply(
                    'one page; cursor "": the last',
                    obj(
                        ["namespace", "queues", "cursor"],
                        namespace={"type": "string"},
                        queues={"type": "array", "items": listed},
                        cursor={"type": "string"},
                    ),
                    {
                        "namespace": "demo",
                        "queues": [
                            {
                                "queue": "orders",
                                "ready": 40,
                                "delayed": 0,
                                "reserved": 3,
                                "dead": 2,
                                "paused": True,
                                "oldest_due_ms": 1795550000000,
                                "lateness_ms": 5120,
                            }
                        ],
                        "cursor": "",
                    },
                ),
            },
            [
                NS,
                uint("limit", "queues per page", 100, MAX_LIST, 1),
                param(
                    "cursor",
                    "query",
                    {"anyOf": [{"const": ""}, NAME]},
                    "the cursor answered (the last name of the previous page); empty: start",
                ),
            ],
            tag="queue control",
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/size",
            "Sizes per state (size: ready)",
            {**GUARDED, 200: SIZE},
            [NS, Q],
        ),
        Op(
            "DELETE",
            "/api/{ns}/{q}",
            "Destroy the queue: every job in every state",
            {**GUARDED, 204: NO_CONTENT},
            [NS, Q],
        ),
    ]
