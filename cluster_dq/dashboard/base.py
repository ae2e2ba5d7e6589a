"""What every page and action of the dashboard shares (``Dashboard``, which the views build
on): the read-only mode, CSRF protection, flash messages, error pages, rates, and the live
sizes (server-sent events). ``app.py`` assembles the /ui app from it and the views."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import re
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.templating import Jinja2Templates
from starlette.types import Receive, Scope, Send

from cluster_dq import metrics
from cluster_dq.clock import now_ms
from cluster_dq.dashboard import audit, times
from cluster_dq.engine import retry
from cluster_dq.errors import BadRequest, ClusterDQError, PoolUnavailable
from cluster_dq.http import params
from cluster_dq.http.errors import status_of
from cluster_dq.http.origin import foreign
from cluster_dq.metrics import SizeBoard
from cluster_dq.routing import PoolRoute
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import Settings

log = logging.getLogger("cluster_dq.dashboard")
HERE = Path(__file__).resolve().parent
CSRF_COOKIE = "dq_csrf"
CSRF_FIELD = "csrf"
FLASH_COOKIE = "dq_flash"
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)
MAX_FORM_BYTES = 2 * 1024 * 1024  # a publish form carries a body of up to MaxBodyBytes
SSE_PERIOD_S = 1.0
SSE_MAX_QUEUES = 200  # queues one stream reports
SSE_MAX_STREAMS = 32  # streams open at once per worker process (each reads Redis every second)
RATE_WINDOW_S = 10.0  # rates are averaged over about this long
RATE_MIN_GAP_S = 0.5  # the counters are read at most this often

Handler = Callable[[Request], Awaitable[Response]]


def ui_url(request: Request, path: str, **query: str) -> str:
    """A dashboard URL, keeping the request's pool (none for the default one)."""
    pool = request.query_params.get("pool")
    if pool and pool != "default":
        query = {"pool": pool, **query}
    return f"/ui{path}" + (f"?{urlencode(query)}" if query else "")


def queue_names(request: Request) -> tuple[str, str]:
    """The path's namespace and queue, checked (a 400 naming the bad one)."""
    ns, q = request.path_params["ns"], request.path_params["q"]
    params.check_names(ns, q)
    return ns, q


class Forbidden(Exception):
    """An action refused by the dashboard itself (CSRF, read-only): 403, nothing changed."""


class Rates:
    """Published / delivered / acked per second per queue, from this instance's counters
    (every worker's, as a scrape sums them): differences between samples taken when a page
    or a stream asks, over about ``RATE_WINDOW_S``."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._samples: deque[tuple[float, dict[tuple[str, str], dict[str, float]]]] = deque()
        self._last: tuple[float, dict[tuple[str, str], dict[str, float]]] | None = None

    def now(self) -> dict[tuple[str, str], dict[str, float]]:
        t = time.monotonic()
        if self._last is not None and t - self._last[0] < RATE_MIN_GAP_S:
            return self._last[1]  # several streams and pages: one read of the counters
        self.service.metrics.flush()
        try:
            totals = metrics.queue_totals()
        except OSError as e:  # a worker's counter file removed meanwhile: no rates this time
            log.warning("rates not read: %s", e)
            return {}
        while self._samples and t - self._samples[0][0] > 6 * RATE_WINDOW_S:
            self._samples.popleft()
        base = next((s for s in self._samples if RATE_MIN_GAP_S <= t - s[0] <= RATE_WINDOW_S), None)
        self._samples.append((t, totals))
        out: dict[tuple[str, str], dict[str, float]] = {}
        if base is not None:
            dt = t - base[0]
            for key, row in totals.items():
                before = base[1].get(key, {})
                out[key] = {k: max(v - before.get(k, 0.0), 0.0) / dt for k, v in row.items()}
        self._last = (t, out)
        return out


class Dashboard:
    """One per worker process, shared by its pages and actions (``app.mount`` serves them at
    /ui); ``stop()`` ends the live streams (called when the worker begins its shutdown)."""

    def __init__(self, service: Service, settings: Settings, board: SizeBoard) -> None:
        self.service = service
        self.settings = settings
        self.board = board
        self.read_only = settings.read_only
        self.templates = Jinja2Templates(directory=HERE / "templates")
        self.templates.env.autoescape = True
        self.templates.env.globals["read_only"] = self.read_only
        self.templates.env.filters["utc"] = times.shown  # every time a page shows: times.py
        self.templates.env.filters["utc_iso"] = times.iso
        self.stopping = asyncio.Event()
        self.rates = Rates(service)
        self.streams = 0  # live-size streams open in this worker process

    def stop(self) -> None:
        self.stopping.set()

    # -- requests ---------------------------------------------------------------------------

    def route(self, request: Request) -> tuple[str, PoolRoute[RedisPool]]:
        """The pool (or ring) a page is about: ``?pool=``, ``default`` when absent."""
        name = request.query_params.get("pool") or "default"
        return name, self.service.route(name)

    def user(self, request: Request) -> str:
        return str(request.scope.get("state", {}).get("user", "anonymous"))

    async def action_form(self, request: Request) -> FormData:
        """The form of a state-changing request, once it passed the checks every action
        passes: not read-only, same origin, and the CSRF token of the session."""
        if self.read_only:
            raise Forbidden("the dashboard is read-only (AdminReadOnly): nothing was changed")
        # the admin API's check (http/origin.py), for every content type: a form needs no more
        why = foreign(request.headers)
        if why is not None:
            raise Forbidden(f"cross-origin request refused ({why}): nothing was changed")
        limit = max(MAX_FORM_BYTES, 3 * self.settings.MaxBodyBytes + 65536)  # %XX: 3 bytes
        form = await params.form(request, limit, MAX_FORM_BYTES)
        sent = form.get(CSRF_FIELD)
        cookie = _csrf_cookie(request) or ""
        if (
            not isinstance(sent, str)
            or not cookie
            or not hmac.compare_digest(sent.encode(), cookie.encode())
        ):
            raise Forbidden("missing or wrong CSRF token (reload the page): nothing was changed")
        return form

    def intend(self, request: Request, action: str, target: str, pool: str) -> None:
        """Names the change a request is about to make: if Redis fails under it, the audit log
        says so (outcome unknown), as it says what happened to every change that ran."""
        request.state.intent = (action, target, pool)

    # -- responses --------------------------------------------------------------------------

    def render(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        kept = _csrf_cookie(request)
        token = kept or secrets.token_urlsafe(32)
        flash = _read_flash(request.cookies.get(FLASH_COOKIE))
        pool = request.query_params.get("pool") or "default"
        ctx = {
            "csrf": token,
            "flash": flash,
            "pool": pool,
            "pool_q": "" if pool == "default" else urlencode({"pool": pool}),
            "now_ms": now_ms(),
            **context,
        }
        response = self.templates.TemplateResponse(request, name, ctx, status_code=status)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Frame-Options"] = "DENY"
        if kept is None:  # none yet, or an empty or malformed one: replaced
            response.set_cookie(CSRF_COOKIE, token, path="/ui", httponly=True, samesite="strict")
        if flash is not None:
            response.delete_cookie(FLASH_COOKIE, path="/ui")
        return response

    def redirect(self, url: str, flash: str | None = None, level: str = "info") -> Response:
        """303 to ``url`` (a page of the dashboard), with a message shown there once."""
        response = RedirectResponse(url, status_code=303)
        if flash is not None:
            blob = base64.urlsafe_b64encode(json.dumps([level, flash[:2000]]).encode()).decode()
            response.set_cookie(FLASH_COOKIE, blob, path="/ui", httponly=True, samesite="strict")
        return response

    def error_page(self, request: Request, status: int, message: str) -> Response:
        return self.render(request, "error.html", {"status": status, "message": message}, status)

    def page(self, handler: Handler) -> Handler:
        """A page or action handler with the dashboard's error pages: a refused input is a
        400/404/409 page saying why, Redis trouble a 503 page, never a 500 traceback."""

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except Forbidden as e:
                return self.error_page(request, 403, str(e))
            except ClusterDQError as e:
                status = status_of(e)
                intent = getattr(request.state, "intent", None)
                if status >= 500 and intent is not None:
                    action, target, pool = intent
                    outcome = f"unknown: {e}"
                    await audit.record(
                        self.service, self.user(request), action, target, outcome, pool
                    )
                if isinstance(e, PoolUnavailable):
                    log.warning("dashboard 503: %s (%s)", e, e.detail)
                elif status >= 500:
                    log.warning("dashboard %d: %s", status, e)
                    return self.error_page(request, 503, "redis unavailable; try again")
                return self.error_page(request, status, str(e))

        guarded.__name__ = handler.__name__
        return guarded

    # -- live sizes -------------------------------------------------------------------------

    async def events(self, request: Request) -> Response:
        """``text/event-stream``: every second, an event ``sizes`` with the sizes, paused flags
        and rates of the queues of ``?ns=`` (all of it, or only ``?q=``) until the client
        leaves or the worker shuts down."""
        _, route = self.route(request)
        ns = request.query_params.get("ns", "")
        q = request.query_params.get("q") or None
        if ns:
            params.check_names(ns, q)
        elif q:
            raise BadRequest("q needs ns", "q")
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        if request.method == "HEAD":  # headers only: a stream would never complete the reply
            return Response(media_type="text/event-stream", headers=headers)

        if self.streams >= SSE_MAX_STREAMS:
            page = self.error_page(
                request, 503, f"too many live streams open ({SSE_MAX_STREAMS}); try again later"
            )
            page.headers["Retry-After"] = "10"
            return page

        async def stream() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            while not self.stopping.is_set():
                try:
                    # each look its own retry budget (the request's ran out long ago)
                    with retry.request_deadline(time.monotonic() + self.settings.RetryBudgetSecond):
                        data = await self._sizes_event(route, ns, q)
                    yield f"event: sizes\ndata: {json.dumps(data)}\n\n"
                except ClusterDQError as e:
                    yield f"event: trouble\ndata: {json.dumps(str(e))}\n\n"
                try:
                    await asyncio.wait_for(self.stopping.wait(), SSE_PERIOD_S)
                except TimeoutError:
                    pass
            yield "event: bye\ndata: {}\n\n"

        self.streams += 1
        return _Counted(self, stream(), media_type="text/event-stream", headers=headers)

    async def _sizes_event(
        self, route: PoolRoute[RedisPool], ns: str, q: str | None
    ) -> dict[str, Any]:
        rows = await self.queue_rows(route, ns, q)
        return {"at_ms": now_ms(), "queues": rows[:SSE_MAX_QUEUES]}

    async def queue_rows(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        q: str | None = None,
        cut: set[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Every queue of ``ns`` (every namespace when ``ns`` is '') or only ``q``: sizes by
        state, paused, oldest due and lateness, rates. Up to ``MAX_LIST`` queues of each
        namespace: those with more are added to ``cut``."""
        if ns:
            namespaces = [ns]
        else:
            namespaces = list((await self.service.info(route)).keys())
        rates = self.rates.now()
        rows: list[dict[str, Any]] = []
        for name in namespaces:
            if q is not None:
                found, _ = await self.service.list_queues(route, name, _before(q), 1)
                page = [(o, t) for o, t in found if o.name == q]
            else:
                page, more = await self.service.list_queues(route, name, "", params.MAX_LIST)
                if more and cut is not None:
                    cut.add(name)
            for o, t in page:
                s = o.sizes
                r = rates.get((name, o.name), {})
                rows.append(
                    {
                        "ns": name,
                        "q": o.name,
                        "ready": s.ready,
                        "delayed": s.delayed,
                        "reserved": s.reserved,
                        "dead": s.dead,
                        "paused": o.paused,
                        "oldest_due_ms": o.oldest_due_ms,
                        "lateness_ms": None if o.oldest_due_ms is None else t - o.oldest_due_ms,
                        "published_rate": r.get("published"),
                        "delivered_rate": r.get("delivered"),
                        "acked_rate": r.get("acked"),
                    }
                )
        return rows


class _Counted(StreamingResponse):
    """A live-size stream that counts itself open until it ends, however it ends (the
    client left, the worker stops, or the client left before it began)."""

    def __init__(self, dashboard: Dashboard, content: AsyncIterator[str], **kw: Any) -> None:
        super().__init__(content, **kw)
        self.dashboard = dashboard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.dashboard.streams -= 1


def _csrf_cookie(request: Request) -> str | None:
    """The session's CSRF token when its cookie holds one this dashboard could have made."""
    token = request.cookies.get(CSRF_COOKIE, "")
    return token if _TOKEN_RE.fullmatch(token) else None


def _read_flash(raw: str | None) -> tuple[str, str] | None:
    if not raw:
        return None
    try:
        level, text = json.loads(base64.urlsafe_b64decode(raw.encode()))
    except (ValueError, TypeError):
        return None
    if level not in ("info", "ok", "warn", "error") or not isinstance(text, str):
        return None
    return level, text


def _before(name: str) -> str:
    """The listing cursor that starts a page at ``name`` (the names sort byte-wise)."""
    return name[:-1] + chr(ord(name[-1]) - 1) + "\U0010ffff" if name else ""
