"""The data API (lmstfy-compatible): routes, rate limiting, and the error table."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cluster_dq.clock import now_ms
from cluster_dq.engine.aio import leaked_transport_race
from cluster_dq.errors import BadRequest, ClusterDQError, Conflict, PoolUnavailable, RateLimited
from cluster_dq.http import params
from cluster_dq.http.middleware import AccessLog, RequestIdMiddleware
from cluster_dq.http.responses import error, job_object, json
from cluster_dq.models import CLIENT_ID_MAX_LEN, MAX_BATCH_ACK, JobSpec
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.service import Service
from cluster_dq.settings import Settings
from cluster_dq.tokens import split_token

log = logging.getLogger("cluster_dq.http")
Handler = Callable[[Request], Awaitable[Response]]


def error_handlers() -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    """One table: every exception class -> one status; nothing user-caused becomes a 500."""

    async def dq_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ClusterDQError)
        if isinstance(exc, RateLimited):
            return error(str(exc), 429, key="msg")
        if isinstance(exc, Conflict):
            return json({"error": str(exc), "job_id": exc.job_id, "state": exc.state,
                         "conflicts": [{"job_id": j, "state": st} for j, st in exc.conflicts]}, 409)  # fmt: skip
        if isinstance(exc, PoolUnavailable):
            log.warning("503: %s", exc)
        return error(str(exc), exc.status)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        messages = {404: "api not found", 405: "method not allowed"}
        return error(messages.get(exc.status_code, exc.detail), exc.status_code)

    async def redis_down(request: Request, exc: Exception) -> Response:
        # A safety net: the service maps Redis failures to PoolUnavailable where it calls
        # Redis; anything that slips through is still a 503, never a 500.
        log.warning("503 (unmapped Redis failure): %s: %s", type(exc).__name__, exc)
        return error(f"redis unavailable: {type(exc).__name__}: {exc}", 503)

    async def crash(request: Request, exc: Exception) -> Response:
        if leaked_transport_race(exc):  # redis-py leaked a closed connection as another error
            return await redis_down(request, exc)
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error("internal error", 500)

    return {ClusterDQError: dq_error, HTTPException: http_error, RedisError: redis_down,
            OSError: redis_down, Exception: crash}  # fmt: skip


class DataAPI:
    def __init__(self, service: Service, settings: Settings) -> None:
        self.service = service
        self.s = settings

    # -- helpers ----------------------------------------------------------------------------

    async def _auth(self, request: Request, ns: str, q: str | None = None) -> PoolRoute[RedisPool]:
        params.check_names(ns, q)
        token = request.headers.get("x-token") or request.query_params.get("token")
        return await self.service.authorize(token, ns)

    async def _limited(self, request: Request, ns: str, write: bool, ok_status: int,
                       handler: Callable[[], Awaitable[Response]]) -> Response:  # fmt: skip
        """lmstfy's throttle: count the request, refund it unless it succeeded."""
        raw = request.headers.get("x-token") or request.query_params.get("token") or ""
        pool_name, token = split_token(raw)
        taken = await self.service.tokens.take(pool_name, ns, token, write)
        response: Response | None = None
        try:
            response = await handler()
            return response
        finally:
            if taken and (response is None or response.status_code != ok_status):
                await self.service.tokens.refund(pool_name, ns, token, write)

    def _specs(self, request: Request) -> functools.partial[JobSpec]:
        """The job the query asks for, given its body: parsed once, built per body (bulk)."""
        qp = request.query_params
        s = self.s
        return functools.partial(
            JobSpec,
            delay_ms=params.millis(qp, "delay", s.DelaySecond),
            ttl_ms=params.millis(qp, "ttl", s.TTLSecond),
            tries=params.uint(qp, "tries", s.TriesNum, 65535),
            priority=params.uint(qp, "priority", 0, 255),
            attributes=params.attributes(request),
            job_id=params.job_id(qp["job_id"]) if "job_id" in qp else None,
        )

    # -- routes -----------------------------------------------------------------------------

    async def publish(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        # Read the body before anything can refuse the request: answering with unread
        # request bytes in the socket makes the server close it with a reset (client error).
        body = await params.body(request, self.s.MaxBodyBytes)
        route = await self._auth(request, ns, q)

        async def run() -> Response:
            (p,) = await self.service.publish(route, ns, q, [self._specs(request)(body)])
            out: dict[str, Any] = {"msg": "published", "job_id": p.job_id}
            if p.duplicate:
                out["duplicate"] = True  # idempotent publish: this id already exists
            return json(out, 201)

        return await self._limited(request, ns, True, 201, run)

    async def bulk(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        data = await params.body(request, self.s.MaxBodyBytes * 64 + 1024)  # see publish
        route = await self._auth(request, ns, q)

        async def run() -> Response:
            spec = self._specs(request)
            if spec.keywords["job_id"] is not None:
                raise BadRequest("job_id is not allowed in bulk publish", "job_id")
            bodies = params.bulk_elements(data, self.s.MaxBodyBytes)
            published = await self.service.publish(route, ns, q, [spec(b) for b in bodies])
            return json({"msg": "published", "job_ids": [p.job_id for p in published]}, 201)

        return await self._limited(request, ns, True, 201, run)

    async def republish(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        body = await params.body(request, self.s.MaxBodyBytes)  # see publish
        old = params.job_id(request.path_params["job_id"])
        route = await self._auth(request, ns, q)
        lease = params.lease(request.query_params)
        p = await self.service.republish(route, ns, q, old, self._specs(request)(body), lease)
        out: dict[str, Any] = {"msg": "published", "job_id": p.job_id}
        if p.duplicate:
            out["duplicate"] = True  # the new id already existed: nothing new was published
        return json(out, 201)

    async def consume(self, request: Request) -> Response:
        ns = request.path_params["ns"]
        queues = params.queue_list(ns, request.path_params["queues"])
        route = await self._auth(request, ns)

        async def run() -> Response:
            qp = request.query_params
            s = self.s
            ttr_ms = params.millis(qp, "ttr", s.TTRSecond)
            timeout_ms = params.millis(qp, "timeout", s.TimeoutSecond, s.MaxTimeoutSecond)
            n = params.count(qp)
            jobs = await self.service.consume(route, ns, queues, ttr_ms, n, timeout_ms)
            if not jobs:
                return error("no job available", 404, key="msg")
            now = now_ms()
            if n == 1:
                response = json(job_object(jobs[0], now))
                if jobs[0].lease:
                    response.headers["X-Lease"] = jobs[0].lease
                return response
            return json([job_object(j, now) for j in jobs])

        return await self._limited(request, ns, False, 200, run)

    async def ack(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self._auth(request, ns, q)
        lease = params.lease(request.query_params)
        await self.service.ack(route, ns, q, [jid], [lease] if lease else None)
        return Response(status_code=204)

    async def ack_many(self, request: Request) -> Response:
        """Batch ack (extension): many ids in one request and one script, so a consumer of
        ``count`` jobs spends two round trips on them, not ``count + 1``."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        data = await params.body(request, MAX_BATCH_ACK * (CLIENT_ID_MAX_LEN + 8) + 1024)  # see publish
        route = await self._auth(request, ns, q)
        ids, leases = params.id_list(data)
        states = await self.service.ack(route, ns, q, ids, leases if any(leases) else None)
        missing = [i for i, s in zip(ids, states) if s is None]
        return json({"msg": "acked", "acked": len(ids) - len(missing), "not_found": missing})

    async def release(self, request: Request) -> Response:
        """Nack (extension): give a reserved job back now or after ``delay``/``delay_ms``;
        its delivery counts, so the last try goes to the dead letter."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self._auth(request, ns, q)
        delay_ms = params.millis(request.query_params, "delay", 0)
        lease = params.lease(request.query_params)
        state = await self.service.release(route, ns, q, jid, delay_ms, lease)
        return json({"msg": "released", "job_id": jid, "state": str(state)})

    async def touch(self, request: Request) -> Response:
        """Extend the time to run (extension): the reservation now ends ``ttr`` from now."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        jid = params.job_id(request.path_params["job_id"])
        route = await self._auth(request, ns, q)
        ttr_ms = params.millis(request.query_params, "ttr", self.s.TTRSecond)
        if ttr_ms < 1:
            raise BadRequest("invalid ttr", "ttr")
        lease = params.lease(request.query_params)
        await self.service.touch(route, ns, q, jid, ttr_ms, lease)
        return json({"msg": "touched", "job_id": jid, "ttr_ms": ttr_ms})

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
        return json(job_object(job, now_ms(), msg=False))

    async def size(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self._auth(request, ns, q)
        s = await self.service.sizes(route, ns, q)
        return json({"namespace": ns, "queue": q, "size": s.ready, "delayed": s.delayed,
                     "reserved": s.reserved, "dead": s.dead})  # fmt: skip

    async def destroy(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self._auth(request, ns, q)
        await self.service.destroy(route, ns, q)
        return Response(status_code=204)

    async def deadletter(self, request: Request) -> Response:
        ns, q = request.path_params["ns"], request.path_params["q"]
        route = await self._auth(request, ns, q)
        qp = request.query_params
        if request.method == "GET":
            s = await self.service.sizes(route, ns, q)
            head = await self.service.dead_head(route, ns, q)
            return json({"namespace": ns, "queue": q, "deadletter_size": s.dead,
                         "deadletter_head": head.job_id if head else ""})  # fmt: skip
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

    def routes(self) -> list[Route]:
        return [
            Route("/api/{ns}/{q}/bulk", self.bulk, methods=["PUT"]),
            Route("/api/{ns}/{q}/ack", self.ack_many, methods=["POST"]),
            Route("/api/{ns}/{q}/peek", self.peek, methods=["GET"]),
            Route("/api/{ns}/{q}/size", self.size, methods=["GET"]),
            Route("/api/{ns}/{q}/deadletter/size", self.deadletter_size, methods=["GET"]),
            Route("/api/{ns}/{q}/deadletter", self.deadletter, methods=["GET", "PUT", "DELETE"]),
            Route("/api/{ns}/{q}/job/{job_id}/release", self.release, methods=["POST"]),
            Route("/api/{ns}/{q}/job/{job_id}/touch", self.touch, methods=["POST"]),
            Route("/api/{ns}/{q}/job/{job_id}", self.republish, methods=["PUT"]),
            Route("/api/{ns}/{q}/job/{job_id}", self.ack, methods=["DELETE"]),
            Route("/api/{ns}/{q}/job/{job_id}", self.peek_job, methods=["GET"]),
            Route("/api/{ns}/{q}", self.publish, methods=["PUT"]),
            Route("/api/{ns}/{q}", self.destroy, methods=["DELETE"]),
            Route("/api/{ns}/{queues}", self.consume, methods=["GET"]),
        ]


def build_app(routes: list[Route], access_log: AccessLog, port: str) -> Starlette:
    """A Starlette app with the error table and the request middleware (metrics labelled by
    route template, request ids, access log): the data and the admin port alike."""
    app = Starlette(routes=routes, exception_handlers=error_handlers())
    app.add_middleware(RequestIdMiddleware, access_log=access_log, port=port,
                       templates={r.endpoint: r.path for r in routes})  # fmt: skip
    return app


def create_data_app(service: Service, settings: Settings, access_log: AccessLog) -> Starlette:
    return build_app(DataAPI(service, settings).routes(), access_log, "data")
