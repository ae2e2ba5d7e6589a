"""A queue's groups: a page of those holding jobs, one group, and its settings (pause,
concurrency limit, rate limit), changed at run time. The routes, their handlers and their
OpenAPI declarations."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cluster_dq import userjson
from cluster_dq.engine.commands import Group, GroupChanges, check_group
from cluster_dq.engine.groups import (
    MAX_CONCURRENCY,
    MAX_GROUP_PAGE,
    cursor_of,
    parse_changes,
)
from cluster_dq.http import params
from cluster_dq.http.guard import GUARDED, Handlers
from cluster_dq.http.openapi import E413, INT, NS, Q, Op, json_body, obj, param, reply, uint
from cluster_dq.http.responses import json
from cluster_dq.names import GROUP_RE


def group_object(g: Group) -> dict[str, Any]:
    return {
        "group": g.name,
        "size": g.size,
        "reserved": g.reserved,
        "held": g.held,
        "paused": g.paused,
        "concurrency": g.concurrency,
        "rate": g.rate.text() if g.rate else None,
    }


class GroupsAPI(Handlers):
    async def groups(self, request: Request) -> Response:
        """The groups holding jobs, a page at a time (``cursor`` as answered; "" when done)."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        qp = params.query(request)
        limit = params.bounded(qp, "limit", 100, 1, MAX_GROUP_PAGE)
        nxt, page = await self.service.groups(route, ns, q, cursor_of(qp.get("cursor")), limit)
        return json(
            {
                "namespace": ns,
                "queue": q,
                "groups": [group_object(g) for g in page],
                "cursor": str(nxt) if nxt else "",
            }
        )

    async def group(self, request: Request) -> Response:
        """One group: read (GET), its settings changed (PATCH, PUT: the fields given), paused
        (``/pause``) or resumed (``/resume``)."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        group = check_group(request.path_params["group"])
        route = await self.auth(request, ns, q)
        if request.method in ("GET", "HEAD"):
            g = await self.service.group(route, ns, q, group)
        else:
            if request.url.path.endswith(("/pause", "/resume")):
                changes = GroupChanges(paused=request.url.path.endswith("/pause"))
            else:
                data = await params.body(request, 64 * 1024)
                body = userjson.parse(data or b"{}", "body", "the body must be a JSON object")
                changes = parse_changes(body)
            g = await self.service.configure_group(route, ns, q, group, changes)
        return json({"namespace": ns, "queue": q, **group_object(g)})

    def routes(self) -> list[Route]:
        write = self.write
        one = write(self.group)
        return [
            Route("/api/{ns}/{q}/groups", self.groups, methods=["GET"]),
            Route("/api/{ns}/{q}/groups/{group}", one, methods=["GET", "PATCH", "PUT"]),
            Route("/api/{ns}/{q}/groups/{group}/pause", one, methods=["POST"]),
            Route("/api/{ns}/{q}/groups/{group}/resume", one, methods=["POST"]),
        ]


# -- the OpenAPI declarations ---------------------------------------------------------------

GROUP_NAME = {"type": "string", "pattern": "^" + GROUP_RE.pattern[2:-2] + "$"}
RATE = {
    "type": "string",
    "pattern": "^[0-9]{1,7}/[0-9]{1,8}(ms|s|m|h)?$",
    "description": "at most <jobs> deliveries per <window> (ms, s: the default, m, h), evenly "
    "spaced from the first (no burst): 10/1s lets one go every 100 ms",
}


def group_operations() -> list[Op]:
    """The routes of ``GroupsAPI.routes``, with what they can answer."""
    schema = obj(
        ["namespace", "queue", "group", "size", "reserved", "held", "paused"]
        + ["concurrency", "rate"],
        namespace={"type": "string"},
        queue={"type": "string"},
        group=GROUP_NAME,
        size={**INT, "description": "its jobs, in every state"},
        reserved={**INT, "description": "its jobs being worked on"},
        held={**INT, "description": "its ready jobs held back by its pause, concurrency or rate"},
        paused={"type": "boolean"},
        concurrency={
            "type": ["integer", "null"],
            "minimum": 1,
            "description": "at most this many of its jobs reserved at once; null: no limit",
        },
        rate={"anyOf": [RATE, {"type": "null"}]},
    )
    example = {
        "namespace": "demo",
        "queue": "orders",
        "group": "tenant-7",
        "size": 1200,
        "reserved": 5,
        "held": 40,
        "paused": False,
        "concurrency": 5,
        "rate": "100/1000ms",
    }
    one = reply("the group, after the change", schema, example)
    listed = {k: v for k, v in schema["properties"].items() if k not in ("namespace", "queue")}
    page = obj(
        ["namespace", "queue", "groups", "cursor"],
        namespace={"type": "string"},
        queue={"type": "string"},
        groups={"type": "array", "items": obj(list(listed), **listed)},
        cursor={"type": "string", "description": 'the next page\'s; "": the last page'},
    )
    changes = {
        "type": "object",
        "description": "the settings to change; null removes one",
        "properties": {
            "paused": {"type": "boolean"},
            "concurrency": {
                "anyOf": [
                    {"type": "integer", "minimum": 1, "maximum": MAX_CONCURRENCY},
                    {"type": "null"},
                ]
            },
            "rate": {"anyOf": [RATE, {"type": "null"}]},
        },
        "additionalProperties": False,
    }
    body = json_body(changes, {"concurrency": 5, "rate": "100/1s"}, required=False)
    path = "/api/{ns}/{q}/groups/{group}"
    g = param("group", "path", GROUP_NAME, "the group", required=True)
    return [
        Op(
            "GET",
            "/api/{ns}/{q}/groups",
            "The queue's groups that hold jobs, a page at a time: sizes, in-flight, limits",
            {
                **GUARDED,
                200: reply(
                    'one page; cursor "": the last',
                    page,
                    {
                        "namespace": "demo",
                        "queue": "orders",
                        "groups": [{k: example[k] for k in listed}],
                        "cursor": "",
                    },
                ),
            },
            [
                NS,
                Q,
                uint("limit", "groups per page (at least, but the last)", 100, MAX_GROUP_PAGE, 1),
                param(
                    "cursor",
                    "query",
                    {"type": "string", "pattern": "^[0-9]{0,20}$"},
                    "the cursor answered; empty: start",
                ),
            ],
            tag="groups",
        ),
        Op(
            "GET",
            path,
            "One group: sizes, in-flight, settings",
            {**GUARDED, 200: one},
            [NS, Q, g],
            tag="groups",
        ),
        *(
            Op(
                method,
                path,
                "Change a group's settings: the fields given (400 naming a bad one, and nothing "
                "changes); held jobs the change lets go are ready at once",
                {**GUARDED, 200: one, 413: E413},
                [NS, Q, g],
                body,
                tag="groups",
            )
            for method in ("PATCH", "PUT")
        ),
        Op(
            "POST",
            path + "/pause",
            "Pause a group: its jobs are held back; the queue's other groups go on",
            {**GUARDED, 200: one},
            [NS, Q, g],
            tag="groups",
        ),
        Op(
            "POST",
            path + "/resume",
            "Resume a group: what it held back is ready again (wakes waiting long-polls)",
            {**GUARDED, 200: one},
            [NS, Q, g],
            tag="groups",
        ),
    ]
