"""Publishing jobs and looking at them: publish one job (or ``bulk``, or as an ack's successor:
republish), peek at a queue's head or at one job by id. The routes, their handlers and their
OpenAPI declarations."""

from __future__ import annotations

import functools
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cluster_dq.backoff import KINDS, MAX_BACKOFF_MS
from cluster_dq.clock import now_ms
from cluster_dq.errors import BadRequest
from cluster_dq.http import params
from cluster_dq.http.guard import GUARDED, Handlers
from cluster_dq.http.openapi import (
    ACK,
    BURY,
    CONSUME,
    E409,
    E409_STATE,
    E413,
    EITHER,
    ID_LINK,
    JOB,
    JOB_ID,
    LEASE,
    NS,
    PEEK,
    PEEKED_EXAMPLE,
    PROGRESS,
    Q,
    RELEASE,
    REPUBLISH,
    RESCHEDULE,
    TOUCH,
    Op,
    Schema,
    error,
    json_body,
    links,
    obj,
    param,
    raw_body,
    ref,
    reply,
    seconds,
    uint,
)
from cluster_dq.http.responses import job_object, json, result_object
from cluster_dq.models import MAX_BULK, MAX_PRIORITY, MAX_TRIES, JobResult, JobSpec
from cluster_dq import names
from cluster_dq.names import DEDUP_MODES, MAX_DEDUP_TTL_MS
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.settings import Settings


def _published(p: Any) -> dict[str, Any]:
    """A publish's lmstfy reply (``p``: the service's ``Published``)."""
    out: dict[str, Any] = {"msg": "published", "job_id": p.job_id}
    if p.duplicate:
        out["duplicate"] = True  # idempotent publish: this id already exists
    return out


def _keyed_reply(out: dict[str, Any], replayed: bool) -> Response:
    """A publish under an Idempotency-Key: the first answer, said to be one when repeated."""
    response = json(out, 201)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


class JobsAPI(Handlers):
    async def _specs(
        self, request: Request, route: PoolRoute[RedisPool], ns: str, q: str
    ) -> functools.partial[JobSpec]:
        """The job the query asks for, given its body: parsed once, built per body (bulk).
        Without ``tries``, the queue's default (its settings), else the service's."""
        qp = params.query(request)
        s = self.s
        tries = s.TriesNum
        if "tries" not in qp:
            tries = (await self.service.queue_defaults(route, ns, q)).tries or tries
        return functools.partial(
            JobSpec,
            delay_ms=params.millis(qp, "delay", s.DelaySecond),
            ttl_ms=params.millis(qp, "ttl", s.TTLSecond),
            tries=params.uint(qp, "tries", tries, MAX_TRIES),
            backoff=params.backoff(qp),
            priority=params.uint(qp, "priority", 0, MAX_PRIORITY),
            attributes=params.attributes(request),
            job_id=params.job_id(qp["job_id"]) if "job_id" in qp else None,
            group=params.group(qp),
        )

    async def publish(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        # The token first: nothing unauthenticated is buffered. A refusal answered with the
        # body unread is safe: the server discards the rest of the body and keeps the
        # connection (tests/http/test_edges.py sends 30 MB with a junk token through httpx).
        route = await self.auth(request, ns, q, params.PUBLISH_KEYS)
        body = await params.body(request, self.s.MaxBodyBytes)

        async def run() -> Response:
            spec = await self._specs(request, route, ns, q)
            dedup = params.dedup(params.query(request))
            idem = params.idempotency(request, b"publish", body)
            if dedup is None and idem is None:
                (p,) = await self.service.publish(route, ns, q, [spec(body)])
                return json(_published(p), 201)
            done = await self.service.publish_keyed(route, ns, q, [spec(body)], dedup, idem)
            out = _published(done.published[0])
            if done.dedup is not None:
                out["dedup"] = done.dedup
            return _keyed_reply(out, done.replayed)

        return await self.throttle.run(request, ns, True, run)

    async def bulk(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        # before the body: see publish; a dedup parameter is a 400 (one job per key)
        route = await self.auth(request, ns, q, params.BULK_KEYS)
        data = await params.body(request, self.s.MaxBodyBytes * 64 + 1024)

        async def run() -> Response:
            spec = await self._specs(request, route, ns, q)
            if spec.keywords["job_id"] is not None:
                raise BadRequest("job_id is not allowed in bulk publish", "job_id")
            bodies = params.bulk_elements(data, self.s.MaxBodyBytes)
            specs = [spec(b) for b in bodies]
            idem = params.idempotency(request, b"bulk", data)
            if idem is None:
                published = await self.service.publish(route, ns, q, specs)
                return json({"msg": "published", "job_ids": [p.job_id for p in published]}, 201)
            done = await self.service.publish_keyed(route, ns, q, specs, None, idem)
            ids = [p.job_id for p in done.published]
            return _keyed_reply({"msg": "published", "job_ids": ids}, done.replayed)

        return await self.throttle.run(request, ns, True, run)

    async def republish(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        old = params.job_id(request.path_params["job_id"])
        route = await self.auth(request, ns, q)  # before the body: see publish
        lease = params.lease(params.query(request))
        body = await params.body(request, self.s.MaxBodyBytes)

        async def run() -> Response:
            spec = await self._specs(request, route, ns, q)
            p = await self.service.republish(route, ns, q, old, spec(body), lease)
            out: dict[str, Any] = {"msg": "published", "job_id": p.job_id}
            if p.duplicate:
                out["duplicate"] = True  # the new id already existed: nothing new was published
            return json(out, 201)

        return await self.throttle.run(request, ns, True, run)  # a write, as publish

    async def peek(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self.auth(request, ns, q)
        job = await self.service.peek(route, ns, q)
        return json(job_object(job, now_ms(), msg=False))

    async def peek_job(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self.auth(request, ns, q)
        job = await self.service.peek_job(route, ns, q, jid)
        if isinstance(job, JobResult):
            return json(result_object(job))
        return json(job_object(job, now_ms(), msg=False))

    def routes(self) -> list[Route]:
        return [
            Route("/api/{ns}/{q}/bulk", self.bulk, methods=["PUT"]),
            Route("/api/{ns}/{q}/peek", self.peek, methods=["GET"]),
            Route("/api/{ns}/{q}/job/{job_id}", self.republish, methods=["PUT"]),
            Route("/api/{ns}/{q}/job/{job_id}", self.peek_job, methods=["GET"]),
            Route("/api/{ns}/{q}", self.publish, methods=["PUT"]),
        ]


# -- the OpenAPI declarations ---------------------------------------------------------------

PUBLISHED = reply(
    "published", ref("Published"), {"msg": "published", "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM"}
)
PUBLISHED["links"] = {
    **links(
        {**ID_LINK, "q": "$request.path.q"},
        PEEK,
        ACK,
        REPUBLISH,
        TOUCH,
        RELEASE,
        PROGRESS,
        BURY,
        RESCHEDULE,
    ),
    # take it: one job, so the answer is one job object with its lease
    **links({"ns": "$request.path.ns", "queues": "$request.path.q", "query.count": 1}, CONSUME),
}

BACKOFF = [
    param(
        "backoff",
        "query",
        {"enum": list(KINDS)},
        "the job's own retry backoff (default: its queue's); none: come back at once",
    ),
    uint(
        "backoff_ms",
        "the backoff's base (required with fixed or exponential)",
        None,
        MAX_BACKOFF_MS,
    ),
    uint("backoff_cap_ms", "the longest exponential wait; 0: none", None, MAX_BACKOFF_MS),
    param(
        "backoff_jitter",
        "query",
        {"type": "number", "minimum": 0, "maximum": 1},
        "the share of each wait a random draw may take off (kept to the thousandth)",
    ),
]


def job_spec(s: Settings, with_id: bool = True) -> list[Schema]:
    """The parameters of a published job (``JobsAPI._specs``)."""
    out = [
        *seconds("delay", "the job becomes ready after this", s.DelaySecond),
        *seconds(
            "ttl",
            "the job expires this long after publishing; 0: never; else longer than the delay",
            s.TTLSecond,
        ),
        uint(
            "tries",
            f"deliveries allowed (default: the queue's tries setting, else {s.TriesNum})",
            None,
            MAX_TRIES,
            1,  # validate_spec: "tries shouldn't be zero"
        ),
        uint("priority", "higher is delivered first within a queue", 0, MAX_PRIORITY),
        *BACKOFF,
        param(
            "group",
            "query",
            {"type": "string", "pattern": f"^{names.GROUP_RE.pattern[2:-2]}$"},
            "the job's group (a tenant, a customer): the queue serves its groups in turn, "
            "each with its own pause, concurrency and rate limits (…/groups/{group})",
        ),
    ]
    if with_id:
        out.append(param("job_id", "query", JOB_ID, "a client-chosen id: idempotent publish"))
    return out


IDEMPOTENCY_KEY = param(
    "Idempotency-Key",
    "header",
    {"type": "string", "pattern": "^[\\x21-\\x7e]{1,255}$"},
    "a repeat of the request (same queue, query and body) within IdempotencyKeySecond gets the "
    "first 201 again (header Idempotent-Replayed: true) and writes nothing; with another "
    "query or body, a 422",
)
DEDUP = [
    param(
        "dedup_key",
        "query",
        {"type": "string", "pattern": "^[-_.:A-Za-z0-9]{1,128}$"},
        "deduplicate on this key (per queue); the reply's dedup says what happened",
    ),
    param(
        "dedup_mode",
        "query",
        {"enum": list(DEDUP_MODES), "default": "simple"},
        "simple: while the key's job exists (not dead); throttle: for dedup_ttl ms after it "
        "was published; debounce: replace the key's waiting job (409 once it is reserved)",
    ),
    uint("dedup_ttl", "throttle's window (ms; required there only)", None, MAX_DEDUP_TTL_MS, 1),
]
E422 = error(
    "the Idempotency-Key came with another request within its window; nothing was written",
    "Idempotency-Key 'pay-1' was used with another request (its query or body differ); "
    "nothing was written",
)


def job_operations(s: Settings) -> list[Op]:
    """The routes of ``JobsAPI.routes``, with what they can answer."""
    full = reply(
        "the token's rate limit (msg), or the queue holds its max_size (error): nothing written",
        EITHER,
        {
            "error": "queue demo/orders is full: the request would take it past its "
            "max_size; nothing was published"
        },
    )
    write = {**GUARDED, 201: PUBLISHED, 413: E413, 429: full}
    peeked = reply("the job; nothing changes", ref("Job"), PEEKED_EXAMPLE)
    return [
        Op(
            "PUT",
            "/api/{ns}/{q}",
            "Publish one job (the raw body)",
            {**write, 409: E409_STATE, 422: E422},
            [NS, Q, *job_spec(s), *DEDUP, IDEMPOTENCY_KEY],
            raw_body(f"the job, at most MaxBodyBytes ({s.MaxBodyBytes}) bytes"),
        ),
        Op(
            "PUT",
            "/api/{ns}/{q}/bulk",
            f"Publish up to {MAX_BULK} jobs, all or nothing",
            {
                **write,
                201: reply(
                    "published",
                    obj(["msg", "job_ids"], msg={"const": "published"}, job_ids={"type": "array"}),
                    {"msg": "published", "job_ids": ["01M84CYQJ90007ZG2JKZ9W9AQM"]},
                ),
                422: E422,
            },
            [NS, Q, *job_spec(s, with_id=False), IDEMPOTENCY_KEY],
            json_body(
                {"type": "array", "minItems": 1, "maxItems": MAX_BULK, "items": {}},
                ["close order 42", {"order": 43}],
            ),
        ),
        Op(
            "PUT",
            "/api/{ns}/{q}/job/{job_id}",
            "Ack a job and publish the body as a new job, atomically",
            {**write, 409: E409},
            [NS, Q, JOB, *job_spec(s), LEASE],
            raw_body("the new job"),
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/peek",
            "The head of the ready queue",
            {
                **GUARDED,
                200: peeked,
                404: error("empty queue or unknown pool", "the queue is empty"),
            },
            [NS, Q],
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/job/{job_id}",
            "One job by id, in any state",
            {
                **GUARDED,
                200: reply(
                    "the job (nothing changes), or, for ResultSecond after an ack with a "
                    "result, that result",
                    {"anyOf": [ref("Job"), ref("Acked")]},
                    PEEKED_EXAMPLE,
                ),
                404: error("no such job (nor a kept result), or unknown pool", "job not found"),
            },
            [NS, Q, JOB],
        ),
    ]
