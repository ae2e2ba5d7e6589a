"""The data API (lmstfy-compatible): its handler groups behind one guard, and the app factory
both ports use. Each concept's routes, handlers and OpenAPI declarations are in its own module:
``jobs.py`` (publish, peek), ``delivery.py`` (consume to ack), ``queues.py``, ``deadletter.py``,
``schedules.py``, ``control.py`` (bury, reschedule), ``workers.py`` (who is running what);
``guard.py`` (the token and its rate limit)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import BaseRoute, Mount, Route

from cluster_dq.http import openapi
from cluster_dq.http.control import ControlAPI
from cluster_dq.http.deadletter import DeadLetterAPI
from cluster_dq.http.delivery import DeliveryAPI
from cluster_dq.http.errors import error_handlers
from cluster_dq.http.guard import Guard, Handlers
from cluster_dq.http.hot import HotPaths
from cluster_dq.http.jobs import JobsAPI
from cluster_dq.http.middleware import AccessLog, RequestIdMiddleware
from cluster_dq.http.openapi_data import data_document
from cluster_dq.http.paths import EncodedSeparators
from cluster_dq.http.queues import QueuesAPI
from cluster_dq.http.groups import GroupsAPI
from cluster_dq.http.schedules import SchedulesAPI
from cluster_dq.http.tracing import TracedRoutes
from cluster_dq.http.workers import WorkersAPI
from cluster_dq.metrics import Metrics
from cluster_dq.service import Service
from cluster_dq.settings import Settings


class DataAPI:
    """Every route of the data port: each concept's handlers, sharing one ``Guard``."""

    def __init__(self, service: Service, settings: Settings) -> None:
        self.guard = guard = Guard(service)
        jobs = JobsAPI(service, settings, guard)
        delivery = DeliveryAPI(service, settings, guard)
        # Publish's routes first: its PUT /api/{ns}/{q} and PUT .../job/{job_id} answer a
        # method those paths do not take (405, and their Allow), as they always have.
        self.groups: list[Handlers] = [
            # (first: /api/{ns}/_workers/{id} is no queue's /api/{ns}/{q}/bulk)
            WorkersAPI(service, settings, guard),
            jobs,
            delivery,
            QueuesAPI(service, settings, guard),
            GroupsAPI(service, settings, guard),
            DeadLetterAPI(service, settings, guard),
            SchedulesAPI(service, settings, guard),
            ControlAPI(service, settings, guard),
        ]
        # the hot paths (``http/hot.py``), called without the router
        self.publish, self.consume, self.ack = jobs.publish, delivery.consume, delivery.ack

    def routes(self) -> list[Route]:
        return [route for group in self.groups for route in group.routes()]

    async def before_405(self, request: Request) -> None:
        """A method a namespace's path does not take: the token first (401, 400 for a bad
        name), so a client without one learns nothing of the route (not the router's 405)."""
        ns = request.path_params.get("ns")
        if ns is not None:
            await self.guard.route(request, ns)  # (a publish's keys: a 405 still)


def build_app(
    routes: Sequence[BaseRoute],
    access_log: AccessLog,
    port: str,
    metrics: Metrics,
    hot: DataAPI | None = None,
    *,
    budget_s: float,
    traced: bool = False,
    before_405: Callable[[Request], Awaitable[object]] | None = None,
) -> Starlette:
    """A Starlette app with the error table and the request middleware (metrics labelled by
    route template, request ids, access log, encoded separators refused before routing:
    ``http/paths.py``): the data and the admin port alike. ``hot``: the
    data API whose hot paths skip the router (``http/hot.py``). ``budget_s``: a request's
    retry budget (``RetryBudgetSecond``). ``traced``: a span per messaging request
    (``http/tracing.py``, ``EnableTracing``). ``before_405``: what a request must pass before
    it is told its path does not take its method (``DataAPI.before_405``)."""
    handlers = error_handlers(before_405)
    app = Starlette(routes=routes, exception_handlers=handlers)
    # A path with a trailing slash is not found (404), not redirected without it: a 307 keeps
    # the method and the body, so a client following it wrote through a path that is no API's.
    app.router.redirect_slashes = False
    if hot is not None:  # added first: the innermost middleware, inside the request ids
        app.add_middleware(
            HotPaths,
            publish=hot.publish,
            consume=hot.consume,
            ack=hot.ack,
            handlers=handlers,
        )
    if traced:  # around the hot paths and the router alike
        app.add_middleware(TracedRoutes)
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
        routes,
        access_log,
        "data",
        service.metrics,
        hot=api,
        budget_s=settings.RetryBudgetSecond,
        traced=settings.EnableTracing,
        before_405=api.before_405,
    )
