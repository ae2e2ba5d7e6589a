"""The dashboard's Starlette sub-app, mounted at ``/ui`` on the admin port: the pages and
actions (``views.py``, ``panel_views.py``, ``history_views.py``, ``worker_views.py``,
``group_views.py``), the live sizes and the static files, behind basic auth (as the admin
API), with the dashboard's own error pages for a missing page."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from cluster_dq.dashboard.base import HERE, Dashboard
from cluster_dq.dashboard.group_views import GroupViews
from cluster_dq.dashboard.history_views import HistoryViews
from cluster_dq.dashboard.panel_views import PanelViews
from cluster_dq.dashboard.views import Views
from cluster_dq.dashboard.worker_views import WorkerViews
from cluster_dq.errors import Unauthorized
from cluster_dq.http.auth import basic_auth
from cluster_dq.metrics import SizeBoard
from cluster_dq.service import Service
from cluster_dq.settings import Settings


class AuthMiddleware:
    """Every request under /ui authenticates as the admin API does; the user is kept in
    ``scope["state"]["user"]`` (the audit log's who). A browser is asked for credentials."""

    def __init__(self, app: ASGIApp, accounts: dict[str, str]) -> None:
        self.app = app
        self.accounts = accounts

    @property
    def routes(self) -> list[BaseRoute]:  # what Mount.routes shows (the metrics' route labels)
        return list(getattr(self.app, "routes", []))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            user = basic_auth(self.accounts, Request(scope))
        except Unauthorized:
            response = Response(
                "authentication required\n",
                401,
                headers={"WWW-Authenticate": 'Basic realm="cluster_dq dashboard"'},
                media_type="text/plain",
            )
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["user"] = user
        await self.app(scope, receive, send)


def create_dashboard(service: Service, settings: Settings, board: SizeBoard) -> Dashboard:
    return Dashboard(service, settings, board)


def routes(dashboard: Dashboard) -> list[BaseRoute]:
    """The dashboard at /ui/, with its pages and actions (the views modules); /ui itself, the
    address people type, goes to /ui/ (the app's other paths are not redirected)."""
    return [Route("/ui", _to_index, methods=["GET"]), mount(dashboard)]


async def _to_index(request: Request) -> Response:
    return RedirectResponse("/ui/", status_code=308)


def mount(dashboard: Dashboard) -> Mount:
    """The dashboard's pages and actions (the views modules), mounted at /ui."""
    return Mount(
        "/ui",
        app=_app(
            dashboard,
            [
                *Views(dashboard).routes(),
                *PanelViews(dashboard).routes(),
                *HistoryViews(dashboard).routes(),
                *WorkerViews(dashboard).routes(),
                *GroupViews(dashboard).routes(),
            ],
        ),
    )


def _app(dashboard: Dashboard, routes: list[BaseRoute]) -> ASGIApp:
    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        messages = {404: "no such page", 405: "method not allowed (actions are POST forms)"}
        message = messages.get(exc.status_code, str(exc.detail))
        page = dashboard.error_page(request, exc.status_code, message)
        page.headers.update(exc.headers or {})  # a 405's Allow
        return page

    app = Starlette(
        routes=[
            *routes,
            Route("/events", dashboard.page(dashboard.events), methods=["GET"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        exception_handlers={HTTPException: not_found},
    )
    app.router.redirect_slashes = False  # (as the API's apps: a 307 keeps method and body)
    return AuthMiddleware(app, dict(dashboard.settings.Accounts))
