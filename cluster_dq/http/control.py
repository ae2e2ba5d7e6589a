"""Per-job control (extensions; lmstfy clients never see them): bury a job into the dead letter
with a reason, give a waiting job a new due time. The routes, their handlers and their OpenAPI
declarations; the dead letter's own (kick, redrive, purge) are in ``http/deadletter.py``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cluster_dq.clock import now_ms
from cluster_dq.errors import BadRequest
from cluster_dq.http import params
from cluster_dq.http.guard import GUARDED, Handlers
from cluster_dq.http.openapi import (
    E409_STATE,
    E413,
    JOB,
    JOB_PATH,
    JSON,
    LEASE,
    NS,
    PEEKED_EXAMPLE,
    Q,
    Op,
    error,
    ref,
    reply,
    text_body,
    text_param,
    uint,
)
from cluster_dq.http.params import MAX_AT_MS, U32
from cluster_dq.http.responses import job_object, json
from cluster_dq.settings import Settings


class ControlAPI(Handlers):
    async def bury(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self.auth(request, ns, q)
        lease = params.lease(params.query(request))
        reason = await params.text(request, "reason")
        job = await self.service.bury(route, ns, q, jid, reason, lease)
        return json(job_object(job, now_ms(), msg=False))

    async def reschedule(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self.auth(request, ns, q)
        qp = params.query(request)
        given = [n for n in ("delay", "delay_ms", "at") if n in qp]
        if len(given) != 1:
            raise BadRequest("give exactly one of delay, delay_ms, at", "at")
        if given[0] == "at":
            at = params.uint(qp, "at", 0, MAX_AT_MS)

            def due(now: int) -> int:
                return at
        else:
            delay_ms = params.millis(qp, "delay", 0)

            def due(now: int) -> int:
                return now + delay_ms

        job = await self.service.reschedule(route, ns, q, jid, due)
        return json(job_object(job, now_ms(), msg=False))

    def routes(self) -> list[Route]:
        write = self.write  # counted against the token's write limit
        return [
            Route(
                "/api/{ns}/{q}/job/{job_id}/bury",
                write(self.bury, leased_is_free=True),  # a consumer's poison job: its delivery
                methods=["POST"],
            ),
            Route(
                "/api/{ns}/{q}/job/{job_id}/reschedule", write(self.reschedule), methods=["POST"]
            ),
        ]


# -- the OpenAPI declarations ---------------------------------------------------------------


def control_operations(s: Settings) -> list[Op]:
    """The routes of ``ControlAPI.routes``, with what they can answer."""
    dead_job = {
        **PEEKED_EXAMPLE,
        "state": "dead",
        "reason": "buried",
        "died_at": 1795466635814,
        "last_error": "malformed payload: no customer id",
    }
    moved = reply("the job in its new state", ref("Job"), dead_job)
    no_job = error("no such job, or unknown pool", "job not found")
    return [
        Op(
            "POST",
            JOB_PATH + "/bury",
            "Bury a reserved, ready or delayed job into the dead letter, with a reason",
            {
                **GUARDED,
                200: moved,
                404: no_job,
                409: reply(
                    "dead already (state), or the lease does not hold the job (conflicts): "
                    "nothing was changed",
                    {"anyOf": [ref("WrongState"), ref("Conflict")]},
                    E409_STATE["content"][JSON]["example"],
                ),
                413: E413,
            },
            [NS, Q, JOB, LEASE, text_param("reason", "kept as the job's last_error")],
            text_body("reason", "malformed payload: no customer id"),
            tag="job control",
        ),
        Op(
            "POST",
            JOB_PATH + "/reschedule",
            "Give a ready or delayed job a new due time (exactly one of delay, delay_ms, at)",
            {
                **GUARDED,
                200: reply("the job, delayed until then (or ready)", ref("Job"), PEEKED_EXAMPLE),
                404: no_job,
                409: E409_STATE,
            },
            [
                NS,
                Q,
                JOB,
                uint("delay", "due this long from now (seconds)", None, U32),
                uint("delay_ms", "due this long from now (milliseconds)", None, U32 * 1000),
                uint("at", "due at this time (Unix ms)", None, MAX_AT_MS),
            ],
            tag="job control",
        ),
    ]
