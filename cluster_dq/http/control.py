"""Routes of per-job control and the dead letter (extensions; lmstfy clients never see them):
bury, kick, reschedule one job; list, redrive and purge dead jobs with a cursor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cluster_dq.clock import now_ms
from cluster_dq.engine.control import FOREVER_MS, MAX_DEAD_PAGE, DeadFilter
from cluster_dq.errors import BadRequest
from cluster_dq.http import params
from cluster_dq.http.responses import dead_letter_object, job_object, json
from cluster_dq.models import DEATH_CODES, MAX_TRIES, UNKNOWN_REASON

if TYPE_CHECKING:
    from cluster_dq.http.app import DataAPI

MAX_AT_MS = 2**48 - 1  # a due time fits the record's u48
DEFAULT_PAGE = 100


class ControlAPI:
    def __init__(self, api: DataAPI) -> None:
        self.api = api
        self.service = api.service
        self.s = api.s

    def _kick_args(self, qp: dict[str, str]) -> tuple[int, int, int]:
        """delay, tries, ttl of a kick or a redrive: lmstfy's respawn rule by default (1 try,
        the default ttl), the ttl longer than the delay."""
        delay_ms = params.millis(qp, "delay", 0)
        tries = params.bounded(qp, "tries", 1, 1, MAX_TRIES)
        ttl_ms = params.millis(qp, "ttl", self.s.TTLSecond)
        if ttl_ms and ttl_ms <= delay_ms:
            raise BadRequest("ttl must be longer than delay", "ttl")
        return delay_ms, tries, ttl_ms

    async def bury(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self.api._auth(request, ns, q)
        lease = params.lease(params.query(request))
        reason = await params.text(request, "reason")
        job = await self.service.bury(route, ns, q, jid, reason, lease)
        return json(job_object(job, now_ms(), msg=False))

    async def kick(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self.api._auth(request, ns, q)
        delay_ms, tries, ttl_ms = self._kick_args(params.query(request))
        job = await self.service.kick(route, ns, q, jid, delay_ms, tries, ttl_ms)
        out = job_object(job, now_ms(), msg=False)
        return json(out)

    async def reschedule(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self.api._auth(request, ns, q)
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

    async def dead_jobs(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.api._auth(request, ns, q)
        qp = params.query(request)
        limit = params.bounded(qp, "limit", DEFAULT_PAGE, 1, MAX_DEAD_PAGE)
        page, cursor = await self.service.dead_jobs(route, ns, q, _cursor(qp), limit)
        return json({"jobs": [dead_letter_object(d) for d in page], "cursor": cursor})

    async def redrive(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.api._auth(request, ns, q)
        qp = params.query(request)
        filt, limit = _filter(qp)
        delay_ms, tries, ttl_ms = self._kick_args(qp)
        n, cursor = await self.service.redrive(
            route, ns, q, filt, _cursor(qp), limit, delay_ms, tries, ttl_ms
        )
        return json(_swept("redriven", n, cursor))

    async def purge(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.api._auth(request, ns, q)
        qp = params.query(request)
        filt, limit = _filter(qp)
        n, cursor = await self.service.purge(route, ns, q, filt, _cursor(qp), limit)
        return json(_swept("purged", n, cursor))

    def routes(self) -> list[Route]:
        write = self.api.write  # counted against the token's write limit
        return [
            Route("/api/{ns}/{q}/deadletter/jobs", self.dead_jobs, methods=["GET"]),
            Route("/api/{ns}/{q}/deadletter/redrive", write(self.redrive), methods=["POST"]),
            Route("/api/{ns}/{q}/deadletter/purge", write(self.purge), methods=["POST"]),
            Route("/api/{ns}/{q}/deadletter/{job_id}/kick", write(self.kick), methods=["POST"]),
            Route(
                "/api/{ns}/{q}/job/{job_id}/bury",
                write(self.bury, leased_is_free=True),  # a consumer's poison job: its delivery
                methods=["POST"],
            ),
            Route(
                "/api/{ns}/{q}/job/{job_id}/reschedule", write(self.reschedule), methods=["POST"]
            ),
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
