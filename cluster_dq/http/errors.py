"""The one HTTP error table: each exception class of the error tree -> one status code, and
the handlers that answer with it. Nothing user-caused becomes a 500."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match

from cluster_dq.errors import (
    BadRequest,
    BodyTooLarge,
    ClusterDQError,
    Conflict,
    IdempotencyMismatch,
    Contended,
    Forbidden,
    NotFound,
    PoolUnavailable,
    QueueFull,
    RateLimited,
    RedisFailure,
    Unauthorized,
    WrongState,
)
from cluster_dq.http.middleware import loggable_path
from cluster_dq.http.responses import error, json

log = logging.getLogger("cluster_dq.http")

STATUS: dict[type[Exception], int] = {
    BadRequest: 400,
    BodyTooLarge: 413,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    WrongState: 409,
    Contended: 409,
    IdempotencyMismatch: 422,
    RateLimited: 429,
    QueueFull: 429,
    PoolUnavailable: 503,
    # A Redis failure no use case gave advice for (a rate-limit count, the admin API): the
    # outcome is unknown; the client gets no address nor Redis error text.
    RedisFailure: 503,
}
REDIS_DOWN = "redis unavailable (unreachable or failing over); the outcome is unknown"


def status_of(exc: BaseException) -> int:
    """The status of ``exc``'s nearest class in the table (500: none, a bug)."""
    return next((STATUS[c] for c in type(exc).__mro__ if c in STATUS), 500)


def allowed(request: Request) -> set[str]:
    """The methods the request's path takes, over every route of the app that matches it
    (Starlette's 405 names the first one's only)."""
    out: set[str] = set()
    router = getattr(request.scope.get("app"), "router", None)
    for route in getattr(router, "routes", ()):
        methods = getattr(route, "methods", None)
        if methods and route.matches(request.scope)[0] is not Match.NONE:
            out |= methods
    return out


def error_handlers(
    before_405: Callable[[Request], Awaitable[object]] | None = None,
) -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    """``before_405``: what a request whose method its path does not take must pass before
    it is told so (the data port's token: 401 first, as on every route of a namespace)."""

    async def dq_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ClusterDQError)
        status = status_of(exc)
        if isinstance(exc, RateLimited):
            return error(str(exc), status, key="msg")
        if isinstance(exc, Conflict):
            return json(
                {
                    "error": str(exc),
                    "job_id": exc.job_id,
                    "state": exc.state,
                    "conflicts": [{"job_id": j, "state": st} for j, st in exc.conflicts],
                },
                status,
            )
        if isinstance(exc, WrongState):
            return json({"error": str(exc), "job_id": exc.job_id, "state": exc.state}, status)
        if isinstance(exc, PoolUnavailable):  # the client gets no address nor Redis error text
            log.warning("503: %s (%s)", exc, exc.detail)
        elif isinstance(exc, RedisFailure):
            log.warning("503: %s", exc)
            return error(REDIS_DOWN, status)
        elif status == 500:
            log.error(
                "500 on %s %s: %s: %s",
                request.method,
                loggable_path(request.url.path),
                type(exc).__name__,
                exc,
            )
        return error(str(exc), status)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405 and before_405 is not None:
            try:
                await before_405(request)
            except ClusterDQError as refused:
                return await dq_error(request, refused)
        messages = {404: "api not found", 405: "method not allowed"}
        out = error(messages.get(exc.status_code, exc.detail), exc.status_code)
        out.headers.update(exc.headers or {})
        if exc.status_code == 405 and (methods := allowed(request)):
            out.headers["Allow"] = ", ".join(sorted(methods))  # not the first route's alone
        return out

    async def untranslated(request: Request, exc: Exception) -> Response:
        # A last line, not a path: every Redis call goes through the engine, which translates
        # its errors. One that did not (a new path calling a client directly) is still an
        # outage to the client, not a 500.
        log.error(
            "untranslated %s on %s %s: %s",
            type(exc).__name__,
            request.method,
            loggable_path(request.url.path),
            exc,
        )
        return error(REDIS_DOWN, 503)

    async def crash(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, loggable_path(request.url.path))
        return error("internal error", 500)

    async def client_gone(request: Request, exc: Exception) -> Response:
        # The client hung up while its body was being read: nobody to answer, nothing to log.
        return error("client disconnected", 400)

    return {
        ClusterDQError: dq_error,
        HTTPException: http_error,
        ClientDisconnect: client_gone,
        RedisError: untranslated,
        Exception: crash,
    }
