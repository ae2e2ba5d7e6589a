"""The data API (lmstfy-compatible): routes and rate limiting; the app factory."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route

from cluster_dq.clock import now_ms
from cluster_dq.engine import retry
from cluster_dq.errors import BadRequest, Unauthorized
from cluster_dq import queueconf
from cluster_dq.http import openapi, params
from cluster_dq.http.control import ControlAPI
from cluster_dq.http.errors import error_handlers
from cluster_dq.http.hot import HotPaths
from cluster_dq.http.paths import EncodedSeparators
from cluster_dq.http.openapi_data import data_document
from cluster_dq.http.middleware import AccessLog, RequestIdMiddleware
from cluster_dq.http.throttle import Throttle
from cluster_dq.http.responses import error, job_object, json, result_object
from cluster_dq.metrics import Metrics
from cluster_dq.models import (
    CLIENT_ID_MAX_LEN,
    MAX_BATCH_ACK,
    MAX_NOTE_BYTES,
    MAX_PRIORITY,
    MAX_TRIES,
    Job,
    JobResult,
    JobSpec,
)
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.schedules import MAX_SCHEDULE_PAGE
from cluster_dq.schedules import check_name as check_schedule_name
from cluster_dq.service import Look, Service
from cluster_dq.settings import Settings
from cluster_dq.tokens import well_formed_raw
from cluster_dq.http.admission import Admission

log = logging.getLogger("cluster_dq.http")
Handler = Callable[[Request], Awaitable[Response]]
T = TypeVar("T")


class DataAPI:
    def __init__(self, service: Service, settings: Settings) -> None:
        self.service = service
        self.s = settings
        self.throttle = Throttle(service)
        self.write = self.throttle.writes  # ControlAPI's routes are counted the same way

    # -- helpers ----------------------------------------------------------------------------

    @functools.cached_property
    def _long_polls(self) -> Admission:
        """The consumes with a timeout running now (MaxWaiters, MaxWaitersPerNamespace)."""
        return Admission(self.s.MaxWaiters, self.s.MaxWaitersPerNamespace)

    async def _auth(self, request: Request, ns: str, q: str | None = None) -> PoolRoute[RedisPool]:
        params.check_names(ns, q)
        token = params.header(request, "x-token") or params.query(request).get("token")
        if token and not well_formed_raw(token):
            raise Unauthorized("invalid token")  # by its shape: no lookup, nothing cached
        return await self.service.authorize(token, ns)

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
        )

    # -- routes -----------------------------------------------------------------------------

    async def publish(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        # The token first: nothing unauthenticated is buffered. A refusal answered with the
        # body unread is safe: the server discards the rest of the body and keeps the
        # connection (tests/http/test_edges.py sends 30 MB with a junk token through httpx).
        route = await self._auth(request, ns, q)
        body = await params.body(request, self.s.MaxBodyBytes)

        async def run() -> Response:
            spec = await self._specs(request, route, ns, q)
            (p,) = await self.service.publish(route, ns, q, [spec(body)])
            out: dict[str, Any] = {"msg": "published", "job_id": p.job_id}
            if p.duplicate:
                out["duplicate"] = True  # idempotent publish: this id already exists
            return json(out, 201)

        return await self.throttle.run(request, ns, True, run)

    async def bulk(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self._auth(request, ns, q)  # before the body: see publish
        data = await params.body(request, self.s.MaxBodyBytes * 64 + 1024)

        async def run() -> Response:
            spec = await self._specs(request, route, ns, q)
            if spec.keywords["job_id"] is not None:
                raise BadRequest("job_id is not allowed in bulk publish", "job_id")
            bodies = params.bulk_elements(data, self.s.MaxBodyBytes)
            published = await self.service.publish(route, ns, q, [spec(b) for b in bodies])
            return json({"msg": "published", "job_ids": [p.job_id for p in published]}, 201)

        return await self.throttle.run(request, ns, True, run)

    async def republish(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        old = params.job_id(request.path_params["job_id"])
        route = await self._auth(request, ns, q)  # before the body: see publish
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

    async def consume(self, request: Request) -> Response:
        if request.method == "HEAD":  # Starlette adds HEAD to GET routes; this GET takes jobs
            response = error("method not allowed", 405)
            response.headers["Allow"] = "GET"
            return response
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
        route = await self._auth(request, ns)

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
        route = await self._auth(request, ns, q)
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
        route = await self._auth(request, ns, q)  # before the body: see publish
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
        route = await self._auth(request, ns, q)
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
        route = await self._auth(request, ns, q)
        ttr_ms = params.millis(params.query(request), "ttr", self.s.TTRSecond)
        if ttr_ms < 1:
            raise BadRequest("invalid ttr", "ttr")
        lease = params.lease(params.query(request))
        await self.service.touch(route, ns, q, jid, ttr_ms, lease)
        return json({"msg": "touched", "job_id": jid, "ttr_ms": ttr_ms})

    async def progress(self, request: Request) -> Response:
        """Record a reserved job's progress (extension): a small JSON body, replacing the last."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self._auth(request, ns, q)  # before the body: see publish
        lease = params.lease(params.query(request))
        raw = await params.body(
            request, MAX_NOTE_BYTES, f"progress too large (max {MAX_NOTE_BYTES} bytes)"
        )
        value = params.note(raw, "progress")
        state = await self.service.progress(route, ns, q, jid, value, lease)
        return json({"msg": "progress saved", "job_id": jid, "state": str(state)})

    async def peek(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self._auth(request, ns, q)
        job = await self.service.peek(route, ns, q)
        return json(job_object(job, now_ms(), msg=False))

    async def peek_job(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self._auth(request, ns, q)
        job = await self.service.peek_job(route, ns, q, jid)
        if isinstance(job, JobResult):
            return json(result_object(job))
        return json(job_object(job, now_ms(), msg=False))

    async def size(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self._auth(request, ns, q)
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
        route = await self._auth(request, ns, q)
        await self.service.destroy(route, ns, q)
        return Response(status_code=204)

    async def deadletter(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self._auth(request, ns, q)
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
        route = await self._auth(request, ns, q)
        s = await self.service.sizes(route, ns, q)
        return json({"namespace": ns, "queue": q, "size": s.dead})

    # -- recurring jobs (extension) ---------------------------------------------------------

    async def put_schedule(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        name = check_schedule_name(request.path_params["name"])
        route = await self._auth(request, ns, q)  # before the body: see publish
        await self.throttle.refuse_write_limited(request, ns)
        body = await params.body(request, self.s.MaxBodyBytes * 2 + 4096)  # JSON-escaped body
        out, created = await self.service.put_schedule(route, ns, q, name, body)
        return json(out, 201 if created else 200)

    async def get_schedule(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        name = check_schedule_name(request.path_params["name"])
        route = await self._auth(request, ns, q)
        return json(await self.service.schedule(route, ns, q, name))

    async def list_schedules(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self._auth(request, ns, q)
        qp = params.query(request)
        cursor = params.uint(qp, "cursor", 0, 2**64 - 1)
        limit = params.uint(qp, "limit", 100, MAX_SCHEDULE_PAGE)
        if limit < 1:
            raise BadRequest("invalid limit", "limit")
        nxt, found = await self.service.schedules(route, ns, q, cursor, limit)
        return json({"namespace": ns, "queue": q, "schedules": found, "cursor": str(nxt)})

    async def delete_schedule(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        name = check_schedule_name(request.path_params["name"])
        route = await self._auth(request, ns, q)
        await self.service.delete_schedule(route, ns, q, name)
        return Response(status_code=204)

    async def pause_schedule(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        name = check_schedule_name(request.path_params["name"])
        route = await self._auth(request, ns, q)
        paused = request.url.path.endswith("/pause")
        if not paused:
            await self.throttle.refuse_write_limited(request, ns)
        return json(await self.service.pause_schedule(route, ns, q, name, paused))

    # -- queue control (extension) ----------------------------------------------------------

    async def settings(self, request: Request) -> Response:
        """A queue's own settings: read (GET) or changed (PATCH, PUT: the fields given)."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self._auth(request, ns, q)
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
        route = await self._auth(request, ns, q)
        paused = request.url.path.endswith("/pause")
        create = params.flag(params.query(request), "create")
        got = await self.service.pause(route, ns, q, paused, create)
        return json({"namespace": ns, "queue": q, **got.as_json()})

    async def queues(self, request: Request) -> Response:
        """The namespace's queues, a page at a time (by name), with sizes and lateness."""
        ns = request.path_params["ns"]
        route = await self._auth(request, ns)
        qp = params.query(request)
        limit = params.uint(qp, "limit", 100)
        if not 1 <= limit <= params.MAX_LIST:
            raise BadRequest(f"invalid limit: 1..{params.MAX_LIST}", "limit")
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
        return [
            Route("/api/{ns}/{q}/schedules", self.list_schedules, methods=["GET"]),
            Route("/api/{ns}/{q}/schedules/{name}", self.write(self.put_schedule), methods=["PUT"]),
            Route("/api/{ns}/{q}/schedules/{name}", self.get_schedule, methods=["GET"]),
            Route(
                "/api/{ns}/{q}/schedules/{name}",
                self.write(self.delete_schedule),
                methods=["DELETE"],
            ),
            Route(
                "/api/{ns}/{q}/schedules/{name}/pause",
                self.write(self.pause_schedule),
                methods=["POST"],
            ),
            Route(
                "/api/{ns}/{q}/schedules/{name}/resume",
                self.write(self.pause_schedule),
                methods=["POST"],
            ),
            Route(
                "/api/{ns}/{q}/settings", self.write(self.settings), methods=["GET", "PATCH", "PUT"]
            ),
            Route("/api/{ns}/{q}/pause", self.write(self.pause), methods=["POST"]),
            Route("/api/{ns}/{q}/resume", self.write(self.pause), methods=["POST"]),
            *ControlAPI(self).routes(),
            Route("/api/{ns}/{q}/bulk", self.bulk, methods=["PUT"]),
            Route("/api/{ns}/{q}/ack", self.ack_many, methods=["POST"]),
            Route("/api/{ns}/{q}/peek", self.peek, methods=["GET"]),
            Route("/api/{ns}/{q}/size", self.size, methods=["GET"]),
            Route("/api/{ns}/{q}/deadletter/size", self.deadletter_size, methods=["GET"]),
            Route(
                "/api/{ns}/{q}/deadletter",
                self.write(self.deadletter),
                methods=["GET", "PUT", "DELETE"],
            ),
            Route("/api/{ns}/{q}/job/{job_id}/release", self.release, methods=["POST"]),
            Route("/api/{ns}/{q}/job/{job_id}/touch", self.touch, methods=["POST"]),
            Route("/api/{ns}/{q}/job/{job_id}/progress", self.progress, methods=["PUT"]),
            Route("/api/{ns}/{q}/job/{job_id}", self.republish, methods=["PUT"]),
            Route("/api/{ns}/{q}/job/{job_id}", self.ack, methods=["DELETE"]),
            Route("/api/{ns}/{q}/job/{job_id}", self.peek_job, methods=["GET"]),
            Route("/api/{ns}/{q}", self.publish, methods=["PUT"]),
            Route("/api/{ns}/{q}", self.write(self.destroy), methods=["DELETE"]),
            Route("/api/{ns}/{queues}", self.consume, methods=["GET"]),
            Route("/api/{ns}", self.queues, methods=["GET"]),
        ]


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


def build_app(
    routes: Sequence[BaseRoute],
    access_log: AccessLog,
    port: str,
    metrics: Metrics,
    hot: DataAPI | None = None,
    *,
    budget_s: float,
) -> Starlette:
    """A Starlette app with the error table and the request middleware (metrics labelled by
    route template, request ids, access log, encoded separators refused before routing:
    ``http/paths.py``): the data and the admin port alike. ``hot``: the
    data API whose hot paths skip the router (``http/hot.py``). ``budget_s``: a request's
    retry budget (``RetryBudgetSecond``)."""
    handlers = error_handlers()
    app = Starlette(routes=routes, exception_handlers=handlers)
    if hot is not None:  # added first: the innermost middleware, inside the request ids
        app.add_middleware(
            HotPaths,
            publish=hot.publish,
            consume=hot.consume,
            ack=hot.ack,
            handlers=handlers,
        )
    app.add_middleware(EncodedSeparators)  # before any routing, the hot paths' included
    app.add_middleware(
        RequestIdMiddleware,
        access_log=access_log,
        metrics=metrics,
        port=port,
        templates=_templates(routes),
        budget_s=budget_s,
    )
    return app


def _busy(refusal: str) -> Response:
    """A long-poll refused by ``Admission`` (nothing reserved): 429, try again in a second."""
    busy = error(refusal, 429, key="msg")
    busy.headers["Retry-After"] = "1"
    return busy


def _templates(
    routes: Sequence[BaseRoute], prefix: str = ""
) -> dict[Any, tuple[str, frozenset[str]]]:
    """Each endpoint's route template and the methods it serves (the metrics' labels),
    mounted apps' routes included."""
    out: dict[Any, tuple[str, frozenset[str]]] = {}
    for r in routes:
        if isinstance(r, Route):
            served = frozenset(r.methods or ())
            if r.endpoint in out:  # one endpoint behind two routes (pause and resume)
                served |= out[r.endpoint][1]
            out[r.endpoint] = (prefix + r.path, served)
        elif isinstance(r, Mount) and r.routes:
            out.update(_templates(r.routes, prefix + r.path))
        elif isinstance(r, Mount):  # an app with no routes (static files): its endpoint
            out[r.app] = (prefix + r.path + "/{path}", frozenset(("GET", "HEAD")))
    return out


def create_data_app(service: Service, settings: Settings, access_log: AccessLog) -> Starlette:
    api = DataAPI(service, settings)
    routes = [*api.routes(), openapi.route(data_document(settings))]
    return build_app(
        routes, access_log, "data", service.metrics, hot=api, budget_s=settings.RetryBudgetSecond
    )
