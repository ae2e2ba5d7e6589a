"""A job's delivery, from its consume to its end: consume (a long-poll, over one or more
queues), ack (one job or many), release (nack), touch (more time to run), progress. The
routes, their handlers and their OpenAPI declarations."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cluster_dq.clock import now_ms
from cluster_dq.engine import retry
from cluster_dq.errors import BadRequest
from cluster_dq.http import params
from cluster_dq.http.admission import Admission
from cluster_dq.http.guard import GUARDED, Handlers
from cluster_dq.http.openapi import (
    ACK,
    BURY,
    E409,
    E413,
    E414,
    EITHER,
    ID_LINK,
    INT,
    JOB,
    JOB_EXAMPLE,
    JOB_ID,
    JSON,
    LEASE,
    LEASE_ID,
    NS,
    PROGRESS,
    Q,
    RELEASE,
    REPUBLISH,
    TOUCH,
    Op,
    Schema,
    json_body,
    links,
    obj,
    param,
    ref,
    reply,
    seconds,
    text_body,
    text_param,
    uint,
)
from cluster_dq.http.openapi import error as error_reply
from cluster_dq.http.params import MAX_QUEUES, U32
from cluster_dq.http.responses import error, job_object, json
from cluster_dq.models import (
    CLIENT_ID_MAX_LEN,
    MAX_BATCH_ACK,
    MAX_BATCH_CONSUME,
    MAX_NAME_LEN,
    MAX_NOTE_BYTES,
    Job,
    JobState,
)
from cluster_dq.service import Look
from cluster_dq.settings import Settings

T = TypeVar("T")


class DeliveryAPI(Handlers):
    @functools.cached_property
    def _long_polls(self) -> Admission:
        """The consumes with a timeout running now (MaxWaiters, MaxWaitersPerNamespace)."""
        return Admission(self.s.MaxWaiters, self.s.MaxWaitersPerNamespace)

    async def consume(self, request: Request) -> Response:
        # A long poll's budget is its timeout, for every Redis step of the request (token,
        # limits, queue settings, the looks): answered when its time runs out, Redis or not.
        try:
            qp = params.query(request)
            timeout_ms = params.millis(qp, "timeout", self.s.TimeoutSecond, self.s.MaxTimeoutSecond)
        except BadRequest:
            timeout_ms = 0  # refused below, after the token (as every parameter is)
        budget = timeout_ms / 1000 if timeout_ms > 0 else self.s.RetryBudgetSecond
        with retry.request_deadline(time.monotonic() + budget):
            return await self._consume(request)

    async def _consume(self, request: Request) -> Response:
        ns = request.path_params["ns"]
        queues = params.queue_list(ns, request.path_params["queues"])
        route = await self.auth(request, ns)

        async def run() -> Response:
            qp = params.query(request)
            s = self.s
            ttr_ms = params.millis(qp, "ttr", s.TTRSecond)
            if "ttr" not in qp and "ttr_ms" not in qp:  # the first queue's default, if any
                for q in queues:
                    default = (await self.service.queue_defaults(route, ns, q)).ttr_ms
                    if default:
                        ttr_ms = default
                        break
            if ttr_ms == 0:  # a reservation that ends as it starts: its lease would hold nothing
                if "ttr_ms" in qp:
                    raise BadRequest("invalid ttr_ms", "ttr_ms")
                ttr_ms = 1_000  # lmstfy's ttr=0: "ready again at the pump's next 1-s tick"
            timeout_ms = params.millis(qp, "timeout", s.TimeoutSecond, s.MaxTimeoutSecond)
            n = params.count(qp)
            refusal = self._long_polls.refusal(ns) if timeout_ms > 0 else None
            if refusal:
                # Bounded memory and tasks per worker, and a share of them per namespace:
                # refuse at once, before reserving anything.
                return _busy(refusal)
            # A first look at once: a long-poll that finds jobs needs no watch for a hang-up.
            look = Look()  # what it saw: the long-poll after it does not look again
            jobs: list[Job] | None = await self.service.consume(
                route, ns, queues, ttr_ms, n, 0, look
            )
            if not jobs and timeout_ms > 0:
                # Asked again with no await before entering: others that passed the check
                # above may have entered during the first look (a burst would pass the bound).
                refusal = self._long_polls.refusal(ns)
                if refusal:
                    return _busy(refusal)
                self._long_polls.enter(ns)
                try:
                    consume = self.service.consume(route, ns, queues, ttr_ms, n, timeout_ms, look)
                    jobs = await _unless_hung_up(request, consume)
                finally:
                    self._long_polls.leave(ns)
            if jobs is None:
                return Response(status_code=499)  # nobody to answer; nothing was kept for them
            if not jobs:
                return error("no job available", 404, key="msg")
            now = now_ms()
            if n == 1:
                response = json(job_object(jobs[0], now))
                if jobs[0].lease:
                    response.headers["X-Lease"] = jobs[0].lease
                return response
            return json([job_object(j, now) for j in jobs])

        return await self.throttle.run(request, ns, False, run)

    async def ack(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self.auth(request, ns, q)
        qp = params.query(request)
        lease = params.lease(qp)
        result = params.result(request)
        (was,) = await self.service.ack(
            route, ns, q, [jid], [lease] if lease else None, [result] if result else None
        )
        # lmstfy's answer (204, no body), with the state the job was cancelled in (extension)
        return Response(status_code=204, headers={"X-Job-State": str(was) if was else "none"})

    async def ack_many(self, request: Request) -> Response:
        """Batch ack (extension): many ids in one request and one script, so a consumer of
        ``count`` jobs spends two round trips on them, not ``count + 1``."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)  # before the body: see JobsAPI.publish
        # room for {"job_id": ..., "lease": ...} elements of the longest ids, and results
        # of MaxBodyBytes together
        room = MAX_BATCH_ACK * (CLIENT_ID_MAX_LEN + 48) + 1024 + self.s.MaxBodyBytes
        data = await params.body(request, room)
        ids, leases, results = params.id_list(data)
        states = await self.service.ack(
            route,
            ns,
            q,
            ids,
            leases if any(leases) else None,
            results if any(results) else None,
        )
        missing = [i for i, s in zip(ids, states) if s is None]
        return json({"msg": "acked", "acked": len(ids) - len(missing), "not_found": missing})

    async def release(self, request: Request) -> Response:
        """Nack (extension): give a reserved job back now or after ``delay``/``delay_ms``;
        its delivery counts, so the last try goes to the dead letter. With ``keep_try=1``
        (a snooze) it does not: the try is restored and the job cannot die of it."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self.auth(request, ns, q)
        qp = params.query(request)
        delay_ms = params.millis(qp, "delay", 0)
        lease = params.lease(qp)
        keep_try = params.flag(qp, "keep_try")
        err = await params.text(request, "error")  # kept as the job's last error
        state = await self.service.release(route, ns, q, jid, delay_ms, lease, err, keep_try)
        return json({"msg": "released", "job_id": jid, "state": str(state)})

    async def touch(self, request: Request) -> Response:
        """Extend the time to run (extension): the reservation now ends ``ttr`` from now."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self.auth(request, ns, q)
        qp = params.query(request)
        ttr_ms = params.millis(qp, "ttr", self.s.TTRSecond)
        if ttr_ms < 1:
            name = "ttr_ms" if "ttr_ms" in qp else "ttr"  # the one given
            raise BadRequest(f"invalid {name}", name)
        lease = params.lease(qp)
        await self.service.touch(route, ns, q, jid, ttr_ms, lease)
        return json({"msg": "touched", "job_id": jid, "ttr_ms": ttr_ms})

    async def progress(self, request: Request) -> Response:
        """Record a reserved job's progress (extension): a small JSON body, replacing the last."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self.auth(request, ns, q)  # before the body: see JobsAPI.publish
        lease = params.lease(params.query(request))
        raw = await params.body(
            request, MAX_NOTE_BYTES, f"progress too large (max {MAX_NOTE_BYTES} bytes)"
        )
        value = params.note(raw, "progress")
        state = await self.service.progress(route, ns, q, jid, value, lease)
        return json({"msg": "progress saved", "job_id": jid, "state": str(state)})

    def routes(self) -> list[Route]:
        return [
            Route("/api/{ns}/{q}/ack", self.ack_many, methods=["POST"]),
            Route("/api/{ns}/{q}/job/{job_id}/release", self.release, methods=["POST"]),
            Route("/api/{ns}/{q}/job/{job_id}/touch", self.touch, methods=["POST"]),
            Route("/api/{ns}/{q}/job/{job_id}/progress", self.progress, methods=["PUT"]),
            Route("/api/{ns}/{q}/job/{job_id}", self.ack, methods=["DELETE"]),
            _no_head(Route("/api/{ns}/{queues}", self.consume, methods=["GET"])),
        ]


def _no_head(route: Route) -> Route:
    """A GET route without the HEAD Starlette adds to it: this GET takes jobs, so a HEAD is
    the router's 405 (its Allow names the path's other methods)."""
    assert route.methods is not None
    route.methods.discard("HEAD")
    return route


async def _unless_hung_up(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Runs a long-poll unless its client hangs up first (then None). uvicorn does not cancel
    a handler whose client left, so without this the hub would go on waiting, and reserve the
    next job, for nobody. Cancelling the consume gives back what it reserved, try unspent."""
    task = asyncio.ensure_future(work)
    hang_up = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((task, hang_up), return_when=asyncio.FIRST_COMPLETED)
    finally:
        hang_up.cancel()
        if not task.done():  # the client left (or this handler is being cancelled)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if task.cancelled() else task.result()


async def _disconnect(request: Request) -> None:
    """Returns when the client has gone (the body, if any, is already read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _busy(refusal: str) -> Response:
    """A long-poll refused by ``Admission`` (nothing reserved): 429, try again in a second."""
    busy = error(refusal, 429, key="msg")
    busy.headers["Retry-After"] = "1"
    return busy


# -- the OpenAPI declarations ---------------------------------------------------------------

# A delivery's own lease (count=1: one job object).
DELIVERED = links(
    {**ID_LINK, "q": "$response.body#/queue", "lease": "$response.body#/lease"},
    ACK,
    REPUBLISH,
    TOUCH,
    RELEASE,
    PROGRESS,
    BURY,
)
RESULT = param(
    "result",
    "query",
    {"type": "string", "maxLength": MAX_NOTE_BYTES, "contentMediaType": JSON},
    f"one JSON value, at most {MAX_NOTE_BYTES} bytes of UTF-8 (413 above; 414 when the "
    "request line outgrows its limit first), kept ResultSecond after the ack and shown by a "
    "peek of the job meanwhile",
)


def delivery_operations(s: Settings) -> list[Op]:
    """The routes of ``DeliveryAPI.routes``, with what they can answer."""
    job_404 = error_reply("no such job, or it is not reserved", "job is not reserved")
    consume_404 = reply(
        "nothing ready within the timeout (msg), or the token's pool is unknown (error)",
        EITHER,
        {"msg": "no job available"},
    )
    too_many = error_reply("rate-limited, or too many consumers waiting", "retry later", "Message")
    too_many["headers"]["Retry-After"] = {"schema": {"type": "string"}}
    cancelled = reply(
        "acked (lmstfy's 204, no body)",
        headers={
            "X-Job-State": {
                "required": True,
                "schema": {"enum": [*(str(st) for st in JobState), "none"]},
                "description": "the state the job was cancelled in; none: no such job",
            }
        },
    )
    return [
        Op(
            "GET",
            "/api/{ns}/{queues}",
            "Consume (long-poll) from one or more queues, in priority order",
            {
                **GUARDED,
                200: reply(
                    "one job object (count=1) or an array of them",
                    {"anyOf": [ref("Job"), {"type": "array", "items": ref("Job")}]},
                    JOB_EXAMPLE,
                    headers={"X-Lease": {"schema": LEASE_ID, "description": "count=1: the lease"}},
                )
                | {"links": DELIVERED},
                404: consume_404,
                429: too_many,
            },
            [
                NS,
                param(
                    "queues",
                    "path",
                    {
                        "type": "string",
                        "pattern": "^[-_A-Za-z0-9,]+$",
                        "maxLength": MAX_QUEUES * (MAX_NAME_LEN + 1),
                    },
                    f"queue names, comma-separated (at most {MAX_QUEUES}); first is served first",
                ),
                *seconds(
                    "ttr",
                    "time to run; ttr=0 means 1 s; without ttr, the first listed queue's ttr_ms "
                    "setting, else this default",
                    s.TTRSecond,
                    ms_minimum=1,
                ),
                *seconds(
                    "timeout",
                    "long-poll: wait this long for a job",
                    s.TimeoutSecond,
                    s.MaxTimeoutSecond,
                ),
                uint("count", "jobs to take at most", 1, MAX_BATCH_CONSUME, 1),
            ],
        ),
        Op(
            "DELETE",
            "/api/{ns}/{q}/job/{job_id}",
            "Ack (delete) a job in any state; 204 also when it does not exist",
            {**GUARDED, 204: cancelled, 409: E409, 413: E413, 414: E414},
            [NS, Q, JOB, LEASE, RESULT],
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/ack",
            "Batch ack, one atomic step",
            {
                **GUARDED,
                200: reply(
                    "acked",
                    obj(
                        ["msg", "acked", "not_found"],
                        msg={"const": "acked"},
                        acked=INT,
                        not_found={"type": "array", "items": {"type": "string"}},
                    ),
                    {"msg": "acked", "acked": 1, "not_found": []},
                ),
                409: E409,
                413: E413,
            },
            [NS, Q],
            json_body(
                _ack_body(),
                [
                    {"job_id": "01M84CYQJ90007ZG2JKZ9W9AQM", "lease": None},
                    {"job_id": "01M84CYQJ90007ZG2JKZ9W9AQN", "result": {"total": 42}},
                ],
            ),
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/job/{job_id}/touch",
            "Extend (or shorten) a reservation: it now ends ttr from now",
            {
                **GUARDED,
                200: reply(
                    "touched",
                    obj(
                        ["msg", "job_id", "ttr_ms"],
                        msg={"const": "touched"},
                        job_id={"type": "string"},
                        ttr_ms=INT,
                    ),
                ),
                404: job_404,
                409: E409,
            },
            [NS, Q, JOB, *seconds("ttr", "the new time to run", s.TTRSecond, U32, 1, 1), LEASE],
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/job/{job_id}/release",
            "Give a reserved job back (nack), now or after a delay",
            {
                **GUARDED,
                200: reply(
                    "released",
                    obj(
                        ["msg", "job_id", "state"],
                        msg={"const": "released"},
                        job_id={"type": "string"},
                        state={"enum": ["ready", "delayed", "dead", "expired"]},
                    ),
                ),
                404: job_404,
                409: E409,
                413: E413,
            },
            [
                NS,
                Q,
                JOB,
                *seconds("delay", "ready again after this", 0),
                LEASE,
                text_param("error", "kept as the job's last_error"),
                uint(
                    "keep_try",
                    "1: a snooze: the delivery is not counted and its try is restored "
                    "(never dead, no backoff)",
                    0,
                    1,
                ),
            ],
            text_body("error", "upstream timed out"),
        ),
        Op(
            "PUT",
            "/api/{ns}/{q}/job/{job_id}/progress",
            "Record a reserved job's progress (one JSON value), replacing the last",
            {
                **GUARDED,
                200: reply(
                    "saved",
                    obj(
                        ["msg", "job_id", "state"],
                        msg={"const": "progress saved"},
                        job_id={"type": "string"},
                        state={"const": "reserved"},
                    ),
                    {
                        "msg": "progress saved",
                        "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM",
                        "state": "reserved",
                    },
                ),
                404: error_reply(
                    "no lease given and no such job, or unknown pool", "job not found"
                ),
                409: reply(
                    "the lease does not hold the job, or (no lease) the job is not in a "
                    "running reservation: nothing was changed",
                    ref("Conflict"),
                    {
                        "error": "job 01M84CYQJ90007ZG2JKZ9W9AQM is not reserved: ready; "
                        "nothing was changed",
                        "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM",
                        "state": "ready",
                        "conflicts": [{"job_id": "01M84CYQJ90007ZG2JKZ9W9AQM", "state": "ready"}],
                    },
                ),
                413: error_reply(
                    f"progress over {MAX_NOTE_BYTES} bytes",
                    f"progress too large (max {MAX_NOTE_BYTES} bytes)",
                ),
            },
            [NS, Q, JOB, LEASE],
            {
                "required": True,
                "description": f"one JSON value, at most {MAX_NOTE_BYTES} bytes as sent",
                "content": {JSON: {"schema": {}, "example": {"done": 120, "of": 500}}},
            },
        ),
    ]


def _ack_body() -> Schema:
    element = {
        "anyOf": [
            JOB_ID,
            {
                "type": "object",
                "properties": {
                    "job_id": JOB_ID,
                    "lease": {"anyOf": [LEASE_ID, {"type": "null"}]},
                    "result": {
                        "description": f"kept ResultSecond after the ack; any JSON value, "
                        f"at most {MAX_NOTE_BYTES} bytes compact"
                    },
                },
                "required": ["job_id"],
                "additionalProperties": False,
            },
        ]
    }
    ids = {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_ACK, "items": element}
    return {
        "anyOf": [
            ids,
            {
                "type": "object",
                "properties": {"job_ids": ids},
                "required": ["job_ids"],
                "additionalProperties": False,
            },
        ]
    }
