"""The admin API (lmstfy's admin port): tokens, limits, pools, info, metrics, health."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import cluster_dq
from cluster_dq import userjson
from cluster_dq.dashboard import app as dashboard
from cluster_dq.errors import BadRequest, Forbidden, NotFound, Unauthorized
from cluster_dq.http import openapi, params
from cluster_dq.http.app import build_app
from cluster_dq.http.auth import basic_auth
from cluster_dq.http.exposition import Exposition
from cluster_dq.http.middleware import AccessLog
from cluster_dq.http.origin import STATE_CHANGING, cross_site
from cluster_dq.http.openapi_admin import admin_document
from cluster_dq.http.responses import error, json
from cluster_dq.metrics import SizeBoard
from cluster_dq.service import Service
from cluster_dq.settings import Settings
from cluster_dq.tokens import Limit, custom_route, mask, split_token, well_formed

Handler = Callable[[Request], Awaitable[Response]]
MAX_TOKEN_FORM = 65_536  # a description and a token: a few hundred bytes; bounded all the same


def _path_token(request: Request) -> tuple[str, str]:
    """The ``[pool:]token`` of the path, refused unless it has the shape the data port accepts
    (a limit stored for it could never apply)."""
    pool, token = split_token(request.path_params["token"])
    if not well_formed(pool, token):
        raise BadRequest(
            "invalid token: [pool:]token, each 1 to 64 characters of [-_A-Za-z0-9]", "token"
        )
    return pool, token


class AdminAPI:
    def __init__(
        self, service: Service, settings: Settings, access_log: AccessLog, board: SizeBoard
    ) -> None:
        self.board = board
        self.exposition = Exposition(board)
        self.service = service
        self.settings = settings
        self.access_log = access_log

    def _basic_auth(self, request: Request) -> None:
        basic_auth(self.settings.Accounts, request)

    def _is_admin(self, request: Request) -> bool:
        """The request has the admin role: basic auth when accounts are set (anyone who
        reaches the admin port when none are)."""
        try:
            basic_auth(self.settings.Accounts, request)
        except Unauthorized:
            return False
        return True

    def _guarded(self, handler: Handler) -> Handler:
        """Every admin route: a state-changing request is refused (403, nothing changed) on a
        read-only port, and when a page on another site could have made it
        (``http/origin.py``, the dashboard's check too)."""

        async def guarded(request: Request) -> Response:
            if request.method in STATE_CHANGING:
                if self.settings.read_only:
                    raise Forbidden(
                        "the admin port is read-only (AdminReadOnly): nothing was changed"
                    )
                why = cross_site(request.method, request.headers)
                if why is not None:
                    raise Forbidden(
                        f"cross-site request refused ({why}; a client sends no Origin):"
                        " nothing was changed"
                    )
            return await handler(request)

        guarded.__name__ = handler.__name__
        return guarded

    async def info(self, request: Request) -> Response:
        name = params.query(request).get("pool") or "default"
        if name not in self.service.token_pools():
            raise BadRequest("the pool was not exists", "pool")
        return json(await self.service.info(self.service.route(name)))

    async def draining(self, request: Request) -> Response:
        """What a migration (``MigrateTo``) or a ring change (``PreviousPools``) still has to
        drain; ``done`` says when the old pools can be let go."""
        name = params.query(request).get("pool") or "default"
        if name not in self.service.token_pools():
            raise BadRequest("the pool was not exists", "pool")
        left = await self.service.draining(self.service.route(name))
        return json(
            {
                "pool": name,
                "done": not left,
                "draining": {
                    pool: {
                        qn: {
                            "size": s.ready,
                            "delayed": s.delayed,
                            "reserved": s.reserved,
                            "dead": s.dead,
                        }
                        for qn, s in sorted(queues.items())
                    }
                    for pool, queues in sorted(left.items())
                },
            }
        )

    async def version(self, request: Request) -> Response:
        return json({"version": cluster_dq.__version__, "build_commit": "", "build_date": ""})

    async def metrics(self, request: Request) -> Response:
        self.service.metrics.flush()  # this worker's buffer; the others flush every second
        body, content_type = await self.exposition.render()  # in a thread, off the loop
        return Response(body, media_type=content_type)

    async def pools(self, request: Request) -> Response:
        return json(self.service.token_pools())  # what a token may name: pools and rings

    async def healthz(self, request: Request) -> Response:
        return json({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Ready or not (200/503); which pool and what Redis said only to the admin role (an
        error names addresses)."""
        states = await self.service.readiness()
        ok = all(s["redis"] and s["scripts"] for s in states.values())
        out: dict[str, object] = {"status": "ok" if ok else "unavailable"}
        if self._is_admin(request):
            out["pools"] = states
        return json(out, 200 if ok else 503)

    async def tokens(self, request: Request) -> Response:
        """The namespace, the pool, the description and a custom token are checked by the
        token store, as for every caller (dashboard, CLI)."""
        self._basic_auth(request)
        ns = request.path_params["ns"]
        pool = params.query(request).get("pool") or None
        service = self.service
        if request.method in ("GET", "HEAD"):  # HEAD (added by Starlette) only reads
            if self.settings.read_only:  # the answer is keyed by token: no mask would do
                raise Forbidden(
                    "the admin port is read-only (AdminReadOnly): token values are not listed"
                    " (the dashboard shows them masked)"
                )
            found = await service.list_tokens(pool or "default", ns)
            prefix = f"{pool}:" if pool else ""
            return json({"tokens": {prefix + t: d for t, d in found.items()}})
        params.check_names(ns)  # before the body is read
        form = await params.form(request, MAX_TOKEN_FORM, MAX_TOKEN_FORM)
        description = params.exact(request, "description") or form.get("description")
        if description is not None and not isinstance(description, str):
            raise BadRequest("invalid description", "description")
        custom = params.query(request).get("token") or form.get("token") or None
        if custom is not None and not isinstance(custom, str):
            raise BadRequest("invalid token", "token")
        token = await service.create_token(pool, ns, description or "", custom)
        if pool is None and ":" not in (custom or ""):
            return json({"token": token}, 201)
        named, _ = custom_route(pool, custom)  # the pool asked for, or the token's pool: prefix
        return json({"token": f"{named}:{token}"}, 201)

    async def delete_token(self, request: Request) -> Response:
        self._basic_auth(request)
        ns = request.path_params["ns"]
        params.check_names(ns)
        pool, token = _path_token(request)
        await self.service.delete_token(pool, ns, token)  # lmstfy: 204 if it did not exist
        return Response(status_code=204)

    async def limit(self, request: Request) -> Response:
        self._basic_auth(request)
        ns = request.path_params["ns"]
        params.check_names(ns)
        pool, token = _path_token(request)
        service = self.service
        if request.method in ("GET", "HEAD"):
            try:
                return json((await service.token_limit(pool, ns, token)).as_json())
            except NotFound:
                return error("limit not found", 404)
        if request.method == "DELETE":
            await service.delete_token_limit(pool, ns, token)
            return json({"msg": "success"})
        raw = await params.body(
            request, 65_536
        )  # a limit is a few dozen bytes; bounded all the same
        data = userjson.parse(
            raw, "limit", 'invalid limit body: {"read","write","interval"}', by_field=True
        )
        lim = Limit.parse(data)
        create = request.method == "POST"
        await service.set_token_limit(pool, ns, token, lim, create)
        return json({"limiter": lim.as_json()}, 201 if create else 200)

    async def limits(self, request: Request) -> Response:
        self._basic_auth(request)
        force = params.query(request).get("force_update", "").lower() in ("1", "true")
        out = []
        for key, lim in sorted((await self.service.token_limits(force)).items()):
            pool, ns, token = key.split("/", 2)
            if self.settings.read_only:
                token = mask(token)
            out.append(
                {
                    "namespace": ns,
                    "token": token if pool == "default" else f"{pool}:{token}",
                    "limiter": lim.as_json(),
                }
            )
        return json(out)

    async def accesslog(self, request: Request) -> Response:
        if request.method == "POST":
            self._basic_auth(request)
            status = params.query(request).get("status")
            if status not in ("enable", "disable"):
                raise BadRequest("invalid status: enable or disable", "status")
            self.access_log.enabled = status == "enable"
        return json({"status": "enabled" if self.access_log.enabled else "disabled"})

    def routes(self) -> list[Route]:
        """Every route guarded (``_guarded``): the admin port has no unguarded change."""
        table: list[tuple[str, Handler, list[str]]] = [
            ("/info", self.info, ["GET"]),
            ("/version", self.version, ["GET"]),
            ("/draining", self.draining, ["GET"]),
            ("/metrics", self.metrics, ["GET"]),
            ("/pools", self.pools, ["GET"]),
            ("/healthz", self.healthz, ["GET"]),
            ("/readyz", self.readyz, ["GET"]),
            ("/limits", self.limits, ["GET"]),
            ("/accesslog", self.accesslog, ["GET", "POST"]),
            ("/token/{ns}", self.tokens, ["GET", "POST"]),
            ("/token/{ns}/{token}", self.delete_token, ["DELETE"]),
            ("/token/{ns}/{token}/limit", self.limit, ["GET", "POST", "PUT", "DELETE"]),
        ]
        return [Route(path, self._guarded(h), methods=methods) for path, h, methods in table]


def create_admin_app(
    service: Service, settings: Settings, access_log: AccessLog, board: SizeBoard
) -> Starlette:
    """The admin port: the admin API, its OpenAPI document and the dashboard (``/ui``; its
    ``Dashboard`` is ``app.state.dashboard``, whose ``stop()`` ends its live streams)."""
    ui = dashboard.create_dashboard(service, settings, board)
    app = build_app(
        [
            *AdminAPI(service, settings, access_log, board).routes(),
            openapi.route(admin_document(settings)),
            *dashboard.routes(ui),
        ],
        access_log,
        "admin",
        service.metrics,
        budget_s=settings.RetryBudgetSecond,
    )
    app.state.dashboard = ui
    return app
