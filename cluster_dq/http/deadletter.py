"""The dead letter: lmstfy's size, head, respawn and delete; and (extensions) its jobs, a page
at a time, one of them kicked back, or those that match redriven or purged in bounded steps with
a cursor. The routes, their handlers and their OpenAPI declarations."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cluster_dq.clock import now_ms
from cluster_dq.engine.control import FOREVER_MS, MAX_DEAD_PAGE, DeadFilter
from cluster_dq.errors import BadRequest
from cluster_dq.http import params
from cluster_dq.http.guard import GUARDED, Handlers
from cluster_dq.http.openapi import (
    E409_STATE,
    INT,
    JOB,
    NO_CONTENT,
    NS,
    PEEKED_EXAMPLE,
    Q,
    REASON,
    SIZE,
    Op,
    Schema,
    error,
    obj,
    param,
    ref,
    reply,
    seconds,
    uint,
)
from cluster_dq.http.params import MAX_AT_MS, U32
from cluster_dq.http.responses import dead_letter_object, job_object, json
from cluster_dq.models import DEATH_CODES, MAX_TRIES, UNKNOWN_REASON
from cluster_dq.settings import Settings

DEFAULT_PAGE = 100  # dead jobs per page or per redrive or purge call, unless limit says


class DeadLetterAPI(Handlers):
    async def deadletter(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        qp = params.query(request)
        if request.method in ("GET", "HEAD"):  # HEAD (added by Starlette) only reads
            s = await self.service.sizes(route, ns, q)
            head = await self.service.dead_head(route, ns, q)
            return json(
                {
                    "namespace": ns,
                    "queue": q,
                    "deadletter_size": s.dead,
                    "deadletter_head": head.job_id if head else "",
                }
            )
        limit = params.uint(qp, "limit", 1)
        if limit < 1:
            raise BadRequest("invalid limit", "limit")
        if request.method == "PUT":
            ttl_ms = params.millis(qp, "ttl", self.s.TTLSecond)
            n = await self.service.respawn(route, ns, q, limit, ttl_ms)
            return json({"msg": "respawned", "count": n})
        await self.service.delete_dead(route, ns, q, limit)
        return Response(status_code=204)

    async def deadletter_size(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        s = await self.service.sizes(route, ns, q)
        return json({"namespace": ns, "queue": q, "size": s.dead})

    def _kick_args(self, qp: dict[str, str]) -> tuple[int, int, int]:
        """delay, tries, ttl of a kick or a redrive: lmstfy's respawn rule by default (1 try,
        the default ttl), the ttl longer than the delay."""
        delay_ms = params.millis(qp, "delay", 0)
        tries = params.bounded(qp, "tries", 1, 1, MAX_TRIES)
        ttl_ms = params.millis(qp, "ttl", self.s.TTLSecond)
        if ttl_ms and ttl_ms <= delay_ms:
            raise BadRequest("ttl must be longer than delay", "ttl")
        return delay_ms, tries, ttl_ms

    async def kick(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self.auth(request, ns, q)
        delay_ms, tries, ttl_ms = self._kick_args(params.query(request))
        job = await self.service.kick(route, ns, q, jid, delay_ms, tries, ttl_ms)
        out = job_object(job, now_ms(), msg=False)
        return json(out)

    async def dead_jobs(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        qp = params.query(request)
        limit = params.bounded(qp, "limit", DEFAULT_PAGE, 1, MAX_DEAD_PAGE)
        page, cursor = await self.service.dead_jobs(route, ns, q, _cursor(qp), limit)
        return json({"jobs": [dead_letter_object(d) for d in page], "cursor": cursor})

    async def redrive(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        qp = params.query(request)
        filt, limit = _filter(qp)
        delay_ms, tries, ttl_ms = self._kick_args(qp)
        n, cursor = await self.service.redrive(
            route, ns, q, filt, _cursor(qp), limit, delay_ms, tries, ttl_ms
        )
        return json(_swept("redriven", n, cursor))

    async def purge(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        qp = params.query(request)
        filt, limit = _filter(qp)
        n, cursor = await self.service.purge(route, ns, q, filt, _cursor(qp), limit)
        return json(_swept("purged", n, cursor))

    def routes(self) -> list[Route]:
        write = self.write  # counted against the token's write limit
        return [
            Route("/api/{ns}/{q}/deadletter/size", self.deadletter_size, methods=["GET"]),
            Route(
                "/api/{ns}/{q}/deadletter",
                write(self.deadletter),
                methods=["GET", "PUT", "DELETE"],
            ),
            Route("/api/{ns}/{q}/deadletter/jobs", self.dead_jobs, methods=["GET"]),
            Route("/api/{ns}/{q}/deadletter/redrive", write(self.redrive), methods=["POST"]),
            Route("/api/{ns}/{q}/deadletter/purge", write(self.purge), methods=["POST"]),
            Route("/api/{ns}/{q}/deadletter/{job_id}/kick", write(self.kick), methods=["POST"]),
        ]


def _cursor(qp: dict[str, str]) -> str | None:
    raw = qp.get("cursor")
    return raw or None


def _filter(qp: dict[str, str]) -> tuple[DeadFilter, int]:
    reason = qp.get("reason")
    if reason is not None and reason not in DEATH_CODES and reason != UNKNOWN_REASON:
        names = ", ".join([*DEATH_CODES, UNKNOWN_REASON])
        raise BadRequest(f"invalid reason: one of {names}", "reason")
    start = params.uint(qp, "from", 0, MAX_AT_MS)
    end = params.uint(qp, "to", FOREVER_MS, FOREVER_MS)
    if start > end:
        raise BadRequest("invalid range: from is after to", "from")
    limit = params.bounded(qp, "limit", DEFAULT_PAGE, 1, MAX_DEAD_PAGE)
    return DeadFilter(reason, start, end), limit


def _swept(what: str, n: int, cursor: str | None) -> dict[str, Any]:
    return {"msg": what, "count": n, "more": cursor is not None, "cursor": cursor}


# -- the OpenAPI declarations ---------------------------------------------------------------


def kick_args(s: Settings) -> list[Schema]:
    """``DeadLetterAPI._kick_args``: a kick's or a redrive's delay, tries and fresh ttl."""
    return [
        *seconds("delay", "ready after this", 0),
        uint("tries", "the tries it gets", 1, MAX_TRIES, 1),
        *seconds("ttl", "a fresh ttl; 0: never; else longer than the delay", s.TTLSecond),
    ]


def dead_letter_operations(s: Settings) -> list[Op]:
    """The routes of ``DeadLetterAPI.routes``, with what they can answer."""
    no_job = error("no such job, or unknown pool", "job not found")
    cursor = param(
        "cursor",
        "query",
        {"type": "string"},
        "where the previous page or call stopped (as answered); absent: from the start",
    )
    limit = uint("limit", "per page / per call", DEFAULT_PAGE, MAX_DEAD_PAGE, 1)
    filters = [
        param("reason", "query", REASON, "only the dead jobs that died for this reason"),
        uint("from", "only those that died at or after this (Unix ms)", 0, MAX_AT_MS),
        uint("to", "only those that died at or before this (Unix ms)", FOREVER_MS, FOREVER_MS),
        limit,
        cursor,
    ]

    def swept(what: str) -> Schema:
        return reply(
            f"{what}; call again with cursor while more is true",
            obj(
                ["msg", "count", "more", "cursor"],
                msg={"const": what},
                count=INT,
                more={"type": "boolean"},
                cursor={"type": ["string", "null"]},
            ),
            {"msg": what, "count": 500, "more": True, "cursor": "0:1795466635814:01M84CYQJ9"},
        )

    return [
        Op(
            "GET",
            "/api/{ns}/{q}/deadletter",
            "Dead-letter size and head",
            {
                **GUARDED,
                200: reply(
                    "size and head (empty string: none)",
                    obj(
                        ["namespace", "queue", "deadletter_size", "deadletter_head"],
                        namespace={"type": "string"},
                        queue={"type": "string"},
                        deadletter_size=INT,
                        deadletter_head={"type": "string"},
                    ),
                ),
            },
            [NS, Q],
            tag="dead letter",
        ),
        Op(
            "PUT",
            "/api/{ns}/{q}/deadletter",
            "Respawn up to limit of the oldest dead jobs to ready",
            {
                **GUARDED,
                200: reply(
                    "respawned",
                    obj(["msg", "count"], msg={"const": "respawned"}, count=INT),
                    {"msg": "respawned", "count": 1},
                ),
            },
            [
                NS,
                Q,
                uint("limit", "dead jobs to respawn at most", 1, U32, 1),
                *seconds("ttl", "the respawned jobs' new ttl", s.TTLSecond),
            ],
            tag="dead letter",
        ),
        Op(
            "DELETE",
            "/api/{ns}/{q}/deadletter",
            "Delete up to limit of the oldest dead jobs",
            {**GUARDED, 204: NO_CONTENT},
            [NS, Q, uint("limit", "dead jobs to delete at most", 1, U32, 1)],
            tag="dead letter",
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/deadletter/size",
            "Dead-letter size",
            {**GUARDED, 200: SIZE},
            [NS, Q],
            tag="dead letter",
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/deadletter/{job_id}/kick",
            "Move one dead job back to ready (or delayed), with fresh tries and ttl",
            {
                **GUARDED,
                200: reply("the job, ready or delayed", ref("Job"), PEEKED_EXAMPLE),
                404: no_job,
                409: E409_STATE,
            },
            [NS, Q, JOB, *kick_args(s)],
            tag="dead letter",
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/deadletter/jobs",
            "Dead jobs, oldest death first, a page at a time (no bodies)",
            {
                **GUARDED,
                200: reply(
                    "one page; cursor null: the end",
                    obj(
                        ["jobs", "cursor"],
                        jobs={"type": "array", "items": ref("DeadLetter")},
                        cursor={"type": ["string", "null"]},
                    ),
                    {
                        "jobs": [
                            {
                                "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM",
                                "reason": "ttr_expired",
                                "died_at": 1795466635814,
                                "deliveries": 3,
                                "last_error": "upstream timed out",
                                "size": 118,
                                "published_at": 1795466500000,
                            }
                        ],
                        "cursor": None,
                    },
                ),
            },
            [NS, Q, limit, cursor],
            tag="dead letter",
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/deadletter/redrive",
            f"Move back the dead jobs that match (one bounded step: at most {MAX_DEAD_PAGE} "
            "looked at)",
            {**GUARDED, 200: swept("redriven")},
            [NS, Q, *filters, *kick_args(s)],
            tag="dead letter",
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/deadletter/purge",
            f"Delete the dead jobs that match (one bounded step: at most {MAX_DEAD_PAGE} "
            "looked at)",
            {**GUARDED, 200: swept("purged")},
            [NS, Q, *filters],
            tag="dead letter",
        ),
    ]
