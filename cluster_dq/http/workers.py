"""Who is running what (extensions; lmstfy clients never see them): a worker announces itself
and the jobs it holds, lasting its ttl, and says when it stops; the namespace's workers are
listed. The routes, their handlers and their OpenAPI declarations. The paths use the reserved
queue name ``_workers`` (no queue starts with ``_``), so no queue's routes are shadowed."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cluster_dq import names, userjson
from cluster_dq.errors import BadRequest
from cluster_dq.http import params
from cluster_dq.http.guard import GUARDED, Handlers
from cluster_dq.http.openapi import (
    E413,
    INT,
    JOB_ID,
    NO_CONTENT,
    NS,
    QUEUE_NAME,
    Op,
    error,
    json_body,
    obj,
    param,
    reply,
    seconds,
)
from cluster_dq.http.responses import json
from cluster_dq.settings import Settings
from cluster_dq.workers import (
    MAX_ANNOUNCEMENT,
    MAX_IN_FLIGHT,
    MAX_LISTED_QUEUES,
    MAX_TTL_S,
    MAX_WORKERS,
    TTL_S,
    WORKERS_QUEUE,
    parse_announcement,
)

WORKERS_PATH = "/api/{ns}/" + WORKERS_QUEUE


def _worker_id(raw: str) -> str:
    if names.job_id(raw):  # the same grammar: 1-64 of [-_A-Za-z0-9]
        raise BadRequest("invalid worker id: 1 to 64 characters of [-_A-Za-z0-9]", "worker_id")
    return raw


class WorkersAPI(Handlers):
    async def workers(self, request: Request) -> Response:
        ns = request.path_params["ns"]
        route = await self.auth(request, ns)

        async def run() -> Response:
            found, truncated = await self.service.list_workers(route, ns)
            out: dict[str, Any] = {"namespace": ns, "workers": found}
            if truncated:
                out["truncated"] = True
            return json(out)

        # a read against the token's limit, as a consume is: a listing can be megabytes
        return await self.throttle.run(request, ns, False, run)

    async def announce(self, request: Request) -> Response:
        ns = request.path_params["ns"]
        route = await self.auth(request, ns)  # (the token first: a stranger learns nothing)
        worker_id = _worker_id(request.path_params["worker_id"])
        ttl_ms = params.millis(params.query(request), "ttl", TTL_S, MAX_TTL_S)
        if ttl_ms < 1:
            raise BadRequest("invalid ttl: at least 1 ms", "ttl")
        raw = await params.body(request, MAX_ANNOUNCEMENT)
        info = parse_announcement(userjson.parse(raw, "body", "invalid announcement: JSON"))
        expires = await self.service.announce_worker(route, ns, worker_id, info, ttl_ms)
        return json({"namespace": ns, "worker_id": worker_id, "expires_ms": expires})

    async def retire(self, request: Request) -> Response:
        ns = request.path_params["ns"]
        route = await self.auth(request, ns)
        worker_id = _worker_id(request.path_params["worker_id"])
        await self.service.retire_worker(route, ns, worker_id)
        return Response(status_code=204)

    def routes(self) -> list[Route]:
        # bookkeeping of consumers, as an ack is: not counted against the write limit
        return [
            Route(WORKERS_PATH, self.workers, methods=["GET"]),
            Route(WORKERS_PATH + "/{worker_id}", self.announce, methods=["PUT"]),
            Route(WORKERS_PATH + "/{worker_id}", self.retire, methods=["DELETE"]),
        ]


# -- the OpenAPI declarations ---------------------------------------------------------------

_HELD = {
    **obj(["queue", "job_id"], queue=QUEUE_NAME, job_id=JOB_ID, started_ms=INT),
    "additionalProperties": False,
}
ANNOUNCEMENT = {
    **obj(
        (),
        host={"type": "string", "maxLength": 255},
        pid={"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
        version={"type": "string", "maxLength": 64},
        started_ms={**INT, "maximum": 2**48 - 1, "description": "when it started (Unix ms)"},
        queues={"type": "array", "items": QUEUE_NAME, "maxItems": MAX_LISTED_QUEUES},
        concurrency={"type": "integer", "minimum": 0, "maximum": 1_000_000},
        in_flight={"type": "array", "items": _HELD, "maxItems": MAX_IN_FLIGHT},
    ),
    "additionalProperties": False,
}
EXAMPLE = {
    "host": "web-3",
    "pid": 4242,
    "version": "0.1.0",
    "started_ms": 1795466600000,
    "queues": ["orders", "emails"],
    "concurrency": 16,
    "in_flight": [
        {"queue": "orders", "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM", "started_ms": 1795466634000}
    ],
}
WORKER_ID = param("worker_id", "path", JOB_ID, "the worker's own id (1-64 of [-_A-Za-z0-9])")


def worker_operations(s: Settings) -> list[Op]:
    """The routes of ``WorkersAPI.routes``, with what they can answer."""
    listed = {
        **ANNOUNCEMENT["properties"],
        "worker_id": JOB_ID,
        "last_seen_ms": INT,
        "expires_ms": INT,
    }
    return [
        Op(
            "GET",
            WORKERS_PATH,
            "The namespace's workers: each one announced and not run out, and the jobs it holds",
            {
                **GUARDED,
                200: reply(
                    "the workers, by id",
                    obj(
                        ["namespace", "workers"],
                        namespace={"type": "string"},
                        workers={"type": "array", "items": obj(["worker_id"], **listed)},
                        truncated={
                            "type": "boolean",
                            "description": "present when the listing stopped at 4 MiB",
                        },
                    ),
                    {
                        "namespace": "demo",
                        "workers": [
                            {
                                "worker_id": "web-3-4242-8f1c",
                                **EXAMPLE,
                                "last_seen_ms": 1795466635000,
                                "expires_ms": 1795466665000,
                            }
                        ],
                    },
                ),
            },
            [NS],
            tag="workers",
        ),
        Op(
            "PUT",
            WORKERS_PATH + "/{worker_id}",
            "Announce a worker (again) for its ttl: who it is, what it consumes, what it holds",
            {
                **GUARDED,
                200: reply(
                    "kept until expires_ms (Unix ms)",
                    obj(
                        ["worker_id", "expires_ms"],
                        namespace={"type": "string"},
                        worker_id=JOB_ID,
                        expires_ms=INT,
                    ),
                    {
                        "namespace": "demo",
                        "worker_id": "web-3-4242-8f1c",
                        "expires_ms": 1795466665000,
                    },
                ),
                413: E413,
                429: error(
                    f"{MAX_WORKERS} other workers are announced in the namespace: nothing written",
                    f"namespace demo has {MAX_WORKERS} workers announced: nothing was written",
                    "Message",
                ),
            },
            [
                NS,
                WORKER_ID,
                *seconds("ttl", "how long it lasts unless announced again", TTL_S, MAX_TTL_S, 1, 1),
            ],
            json_body(ANNOUNCEMENT, EXAMPLE),
            tag="workers",
        ),
        Op(
            "DELETE",
            WORKERS_PATH + "/{worker_id}",
            "A worker stops: its announcement goes at once (204 whether or not there was one)",
            {**GUARDED, 204: NO_CONTENT},
            [NS, WORKER_ID],
            tag="workers",
        ),
    ]
