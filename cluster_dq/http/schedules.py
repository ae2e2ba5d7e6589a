"""Recurring jobs (extension): a queue's schedules, created or replaced, read, listed, deleted,
paused and resumed (``schedules.parse`` reads a definition). The routes, their handlers and
their OpenAPI declarations."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cluster_dq.http import params
from cluster_dq.http.guard import GUARDED, Handlers
from cluster_dq.http.openapi import (
    E409_BUSY,
    E413,
    INT,
    NO_CONTENT,
    NS,
    Q,
    Op,
    Schema,
    error,
    json_body,
    links,
    obj,
    param,
    reply,
    uint,
)
from cluster_dq.http.responses import json
from cluster_dq.models import MAX_PRIORITY, MAX_SECONDS, MAX_TRIES
from cluster_dq.names import SCHEDULE_NAME_RE
from cluster_dq.schedules import (
    DEFAULT_CATCH_UP_MS,
    MAX_CATCH_UP_MS,
    MAX_CRON_LEN,
    MAX_EVERY_MS,
    MAX_SCHEDULE_PAGE,
    MAX_START_MS,
    MAX_TZ_LEN,
    MIN_EVERY_MS,
)
from cluster_dq.schedules import check_name as check_schedule_name
from cluster_dq.settings import Settings


class SchedulesAPI(Handlers):
    async def put_schedule(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        name = check_schedule_name(request.path_params["name"])
        route = await self.auth(request, ns, q)  # before the body: see JobsAPI.publish
        await self.throttle.refuse_write_limited(request, ns)
        body = await params.body(request, self.s.MaxBodyBytes * 2 + 4096)  # JSON-escaped body
        out, created = await self.service.put_schedule(route, ns, q, name, body)
        return json(out, 201 if created else 200)

    async def get_schedule(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        name = check_schedule_name(request.path_params["name"])
        route = await self.auth(request, ns, q)
        return json(await self.service.schedule(route, ns, q, name))

    async def list_schedules(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        qp = params.query(request)
        cursor = params.uint(qp, "cursor", 0, 2**64 - 1)
        limit = params.bounded(qp, "limit", 100, 1, MAX_SCHEDULE_PAGE)
        nxt, found = await self.service.schedules(route, ns, q, cursor, limit)
        return json({"namespace": ns, "queue": q, "schedules": found, "cursor": str(nxt)})

    async def delete_schedule(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        name = check_schedule_name(request.path_params["name"])
        route = await self.auth(request, ns, q)
        await self.service.delete_schedule(route, ns, q, name)
        return Response(status_code=204)

    async def pause_schedule(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        name = check_schedule_name(request.path_params["name"])
        route = await self.auth(request, ns, q)
        paused = request.url.path.endswith("/pause")
        if not paused:
            await self.throttle.refuse_write_limited(request, ns)
        return json(await self.service.pause_schedule(route, ns, q, name, paused))

    def routes(self) -> list[Route]:
        write = self.write  # counted against the token's write limit
        return [
            Route("/api/{ns}/{q}/schedules", self.list_schedules, methods=["GET"]),
            Route("/api/{ns}/{q}/schedules/{name}", write(self.put_schedule), methods=["PUT"]),
            Route("/api/{ns}/{q}/schedules/{name}", self.get_schedule, methods=["GET"]),
            Route(
                "/api/{ns}/{q}/schedules/{name}", write(self.delete_schedule), methods=["DELETE"]
            ),
            Route(
                "/api/{ns}/{q}/schedules/{name}/pause", write(self.pause_schedule), methods=["POST"]
            ),
            Route(
                "/api/{ns}/{q}/schedules/{name}/resume",
                write(self.pause_schedule),
                methods=["POST"],
            ),
        ]


# -- the OpenAPI declarations ---------------------------------------------------------------

SCHEDULE_PATH = "/api/{ns}/{q}/schedules/{name}"
SCHEDULE_EXAMPLE = {
    "namespace": "demo",
    "queue": "reports",
    "name": "nightly",
    "cron": "0 3 * * *",
    "tz": "Europe/Paris",
    "job": {"body": "build", "delay_ms": 0, "ttl_ms": 86400000, "tries": 3, "priority": 0},
    "catch_up_ms": DEFAULT_CATCH_UP_MS,
    "paused": False,
    "next_at_ms": 1795744800000,
    "fired": 12,
    "missed": 0,
}


def _ms(what: str, maximum: int, minimum: int = 0) -> Schema:
    return {"type": "integer", "minimum": minimum, "maximum": maximum, "description": what}


def schedule_operations(s: Settings) -> list[Op]:
    """The routes of ``SchedulesAPI.routes``, with what they can answer (``schedules.parse``
    reads the PUT body)."""
    name = param(
        "name",
        "path",
        {
            "type": "string",
            "pattern": SCHEDULE_NAME_RE.pattern.replace("\\A", "^").replace("\\Z", "$"),
        },
        "the schedule's name",
    )
    job = {
        "type": "object",
        "description": "the job each occurrence publishes (a publish's limits)",
        "properties": {
            "body": {"type": "string", "description": f"UTF-8, at most {s.MaxBodyBytes} bytes"},
            "delay_ms": _ms("ready this long after the occurrence", MAX_SECONDS * 1000),
            "ttl_ms": _ms("counted from the publish; 0: never; else > delay_ms", MAX_SECONDS * 1000)
            | {"default": s.TTLSecond * 1000},
            "tries": {"type": "integer", "minimum": 1, "maximum": MAX_TRIES, "default": s.TriesNum},
            "priority": {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY, "default": 0},
            "group": {
                "type": "string",
                "pattern": "^[-_A-Za-z0-9]{1,64}$",
                "description": "the group of each job it publishes (docs/api.md, Groups)",
            },
        },
        "additionalProperties": False,
    }
    shared = {
        "catch_up_ms": _ms("occurrences at most this old are still published late", MAX_CATCH_UP_MS)
        | {"default": DEFAULT_CATCH_UP_MS},
        "paused": {"type": "boolean", "default": False, "description": "create it paused"},
        "job": job,
    }
    cron = {
        "type": "string",
        "maxLength": MAX_CRON_LEN,
        "description": "five fields (croniter's) or an @alias",
    }
    tz = {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_TZ_LEN,
        "default": "UTC",
        "description": "an IANA time zone",
    }
    every = _ms("occurrences at start_ms + k * every_ms", MAX_EVERY_MS, MIN_EVERY_MS)
    start = _ms("every_ms's anchor (ms since the epoch)", MAX_START_MS) | {"default": 0}
    body = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"cron": cron, "tz": tz, **shared},
                "required": ["cron"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"every_ms": every, "start_ms": start, **shared},
                "required": ["every_ms"],
                "additionalProperties": False,
            },
        ]
    }
    schedule = obj(
        ["namespace", "queue", "name", "job", "catch_up_ms", "paused", "next_at_ms"]
        + ["fired", "missed"],
        namespace={"type": "string"},
        queue={"type": "string"},
        name={"type": "string"},
        cron={"type": "string"},
        tz={"type": "string"},
        every_ms=INT,
        start_ms=INT,
        job=obj(
            ["body", "delay_ms", "ttl_ms", "tries", "priority"],
            body={"type": "string"},
            delay_ms=INT,
            ttl_ms=INT,
            tries=INT,
            priority=INT,
            group={"type": "string", "description": "absent: its jobs have no group"},
        ),
        catch_up_ms=INT,
        paused={"type": "boolean"},
        next_at_ms={
            "type": ["integer", "null"],
            "description": "the next occurrence to publish; null while paused or never",
        },
        fired={**INT, "description": "occurrences published"},
        missed={
            **INT,
            "description": "occurrences skipped: older than catch_up_ms, or refused by a "
            "full queue (max_size)",
        },
    )
    the_schedule = reply("the schedule", schedule, SCHEDULE_EXAMPLE)
    by_name: dict[str, object] = {
        "ns": "$request.path.ns",
        "q": "$request.path.q",
        "name": "$response.body#/name",
    }
    targets = [(SCHEDULE_PATH, m) for m in ("get", "delete")] + [
        (SCHEDULE_PATH + "/pause", "post"),
        (SCHEDULE_PATH + "/resume", "post"),
    ]
    saved = links(by_name, *targets)
    missing = error("no such schedule, or unknown pool", "schedule not found")
    return [
        Op(
            "GET",
            "/api/{ns}/{q}/schedules",
            "List a queue's schedules, a page at a time (HSCAN: in no set order)",
            {
                **GUARDED,
                200: reply(
                    'one page; go on with cursor until it is "0"',
                    obj(
                        ["namespace", "queue", "schedules", "cursor"],
                        namespace={"type": "string"},
                        queue={"type": "string"},
                        schedules={"type": "array", "items": schedule},
                        cursor={"type": "string", "pattern": "^[0-9]+$"},
                    ),
                    {
                        "namespace": "demo",
                        "queue": "reports",
                        "schedules": [SCHEDULE_EXAMPLE],
                        "cursor": "0",
                    },
                ),
            },
            [
                NS,
                Q,
                uint("cursor", "0 to start, then the cursor answered", 0, 2**64 - 1),
                uint("limit", "a hint, as HSCAN's COUNT", MAX_SCHEDULE_PAGE, MAX_SCHEDULE_PAGE, 1),
            ],
            tag="schedules",
        ),
        Op(
            "PUT",
            SCHEDULE_PATH,
            "Create or replace a schedule (the same definition again changes only paused)",
            {
                **GUARDED,
                200: the_schedule | {"links": saved},
                201: reply("created", schedule, SCHEDULE_EXAMPLE) | {"links": saved},
                409: E409_BUSY,
                413: E413,
            },
            [NS, Q, name],
            json_body(body, {"cron": "0 3 * * *", "tz": "Europe/Paris", "job": {"body": "build"}}),
            tag="schedules",
        ),
        Op(
            "GET",
            SCHEDULE_PATH,
            "One schedule",
            {**GUARDED, 200: the_schedule, 404: missing},
            [NS, Q, name],
            tag="schedules",
        ),
        Op(
            "DELETE",
            SCHEDULE_PATH,
            "Delete a schedule (jobs already published stay)",
            {**GUARDED, 204: NO_CONTENT, 404: missing, 409: E409_BUSY},
            [NS, Q, name],
            tag="schedules",
        ),
        Op(
            "POST",
            SCHEDULE_PATH + "/pause",
            "Stop firing",
            {**GUARDED, 200: the_schedule, 404: missing, 409: E409_BUSY},
            [NS, Q, name],
            tag="schedules",
        ),
        Op(
            "POST",
            SCHEDULE_PATH + "/resume",
            "Fire again, from the next occurrence after now",
            {**GUARDED, 200: the_schedule, 404: missing, 409: E409_BUSY},
            [NS, Q, name],
            tag="schedules",
        ),
    ]
