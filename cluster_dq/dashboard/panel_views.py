"""The pages and actions of the dashboard's own panels: the delay timeline (drill-down into a
bin, reschedule a bin), the lateness and redelivery charts and the dead letters grouped by
error fingerprint (fragments the queue and dead-letter pages load), a group's redrive, and the
topology view. Data from ``panels.py``; every change audited, as the other actions are."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from cluster_dq.clock import now_ms
from cluster_dq.dashboard import audit, charts, panels
from cluster_dq.dashboard.base import Dashboard, queue_names, ui_url
from cluster_dq.errors import BadRequest
from cluster_dq.models import MAX_TRIES

_INT_RE = re.compile(r"-?[0-9]{1,15}")
MAX_SHIFT_S = 400 * 86_400


def _int(raw: object, name: str, low: int, high: int) -> int:
    if not isinstance(raw, str) or not _INT_RE.fullmatch(raw.strip()):
        raise BadRequest(f"invalid {name}: a whole number", name)
    value = int(raw.strip())
    if not low <= value <= high:
        raise BadRequest(f"invalid {name}: {low} to {high}", name)
    return value


def _skipped(out: panels.Outcome) -> str:
    if not out.skipped:
        return ""
    first_id, why = out.skipped[0]
    return f"; {len(out.skipped)} left alone (job {first_id}: {why})"


class PanelViews:
    def __init__(self, dashboard: Dashboard) -> None:
        self.d = dashboard
        self.service = dashboard.service
        self.settings = dashboard.settings
        self.ring = charts.CounterRing(
            flush=dashboard.service.metrics.flush, stopping=dashboard.stopping
        )

    # -- helpers ----------------------------------------------------------------------------

    def _audit(self, request: Request, pool: str) -> panels.Audit:
        user = self.d.user(request)

        async def record(action: str, target: str, detail: str) -> None:
            await audit.record(self.service, user, f"job.{action}", target, f"ok: {detail}", pool)

        return record

    # -- delay timeline ---------------------------------------------------------------------

    async def timeline(self, request: Request) -> Response:
        ns, q = queue_names(request)
        _, route = self.d.route(request)
        now = now_ms()
        tl = await panels.timeline(self.service, route, ns, q, now)
        query = request.query_params
        start = end = None
        jobs = None
        if "start" in query or "end" in query:
            start = _int(query.get("start"), "start", 0, 2**48)
            end = _int(query.get("end"), "end", 0, 2**48)
            jobs = await panels.bucket_jobs(self.service, route, ns, q, start, end)
        return self.d.render(
            request,
            "timeline.html",
            {
                "ns": ns,
                "q": q,
                "tl": tl,
                "start": start,
                "end": end,
                "jobs": jobs,
                "limit": panels.BUCKET_JOBS,
                "self_url": ui_url(request, f"/timeline/{ns}/{q}"),
                "queue_url": ui_url(request, f"/queue/{ns}/{q}"),
                "action_url": ui_url(request, f"/timeline/{ns}/{q}/reschedule"),
            },
        )

    async def reschedule(self, request: Request) -> Response:
        ns, q = queue_names(request)
        pool, route = self.d.route(request)
        form: FormData = await self.d.action_form(request)
        start = _int(form.get("start"), "start", 0, 2**48)
        end = _int(form.get("end"), "end", 0, 2**48)
        panels.check_range(start, end)
        if form.get("to") == "now":
            shift, to = None, 0
        else:
            shift, to = _int(form.get("shift"), "shift", -MAX_SHIFT_S, MAX_SHIFT_S) * 1000, None
        out = await panels.reschedule_bucket(
            self.service,
            route,
            ns,
            q,
            start,
            end,
            shift_ms=shift,
            to_ms=to,
            audit=self._audit(request, pool),
        )
        level = "ok" if out.changed or not out.skipped else "warn"
        message = f"rescheduled {len(out.changed)} job(s){_skipped(out)}"
        return self.d.redirect(ui_url(request, f"/timeline/{ns}/{q}"), message, level)

    # -- charts -----------------------------------------------------------------------------

    async def charts(self, request: Request) -> Response:
        """A fragment (the queue page loads it, and again every few seconds)."""
        ns, q = queue_names(request)
        self.d.route(request)  # an unknown ?pool= is a 404, as on every other page
        self.ring.watch(ns, q)
        series = self.ring.series(ns, q)
        lines = {
            "p99": charts.polyline([p.late_p99_ms for p in series]),
            "mean": charts.polyline([p.late_mean_ms for p in series]),
            "redelivered": charts.polyline([p.redelivered for p in series]),
            "ttr": charts.polyline([p.ttr_expired for p in series]),
            "released": charts.polyline([p.released for p in series]),
            "dead": charts.polyline([p.dead for p in series]),
        }
        last = series[-1] if series else None
        totals = {
            "delivered": sum(p.delivered for p in series),
            "redelivered": sum(p.redelivered for p in series),
            "ttr_expired": sum(p.ttr_expired for p in series),
            "released": sum(p.released for p in series),
            "dead": sum(p.dead for p in series),
        }
        return self.d.render(
            request,
            "_panel_charts.html",
            {
                "ns": ns,
                "q": q,
                "series": series,
                "lines": lines,
                "last": last,
                "totals": totals,
                "every_s": self.ring.every_s,
                "minutes": self.ring.keep * self.ring.every_s / 60,
                "peak_late": max((p.late_p99_ms or 0.0 for p in series), default=0.0),
                "peak_redo": max(
                    (max(p.redelivered, p.ttr_expired, p.released, p.dead) for p in series),
                    default=0.0,
                ),
            },
        )

    # -- dead letters by fingerprint ----------------------------------------------------------

    async def dead_groups(self, request: Request) -> Response:
        """A fragment (the dead-letter page loads it)."""
        ns, q = queue_names(request)
        _, route = self.d.route(request)
        got = await panels.dead_groups(self.service, route, ns, q)
        return self.d.render(
            request,
            "_panel_deadgroups.html",
            {
                "ns": ns,
                "q": q,
                "got": got,
                "walk": panels.DEAD_WALK,
                "redrive_max": panels.REDRIVE_MAX,
                "redrive_url": ui_url(request, f"/deadletter/{ns}/{q}/groups/redrive"),
            },
        )

    async def redrive_group(self, request: Request) -> Response:
        ns, q = queue_names(request)
        pool, route = self.d.route(request)
        form = await self.d.action_form(request)
        gid = form.get("group")
        if not isinstance(gid, str):
            raise BadRequest("invalid group", "group")
        tries = _int(form.get("tries") or "1", "tries", 1, MAX_TRIES)
        limit = _int(form.get("limit") or str(panels.REDRIVE_MAX), "limit", 1, panels.REDRIVE_MAX)
        out = await panels.redrive_group(
            self.service,
            route,
            ns,
            q,
            gid,
            tries=tries,
            ttl_ms=self.settings.TTLSecond * 1000,
            limit=limit,
            audit=self._audit(request, pool),
        )
        level = "ok" if out.changed or not out.skipped else "warn"
        message = f"kicked {len(out.changed)} job(s) of group {gid}{_skipped(out)}"
        return self.d.redirect(ui_url(request, f"/deadletter/{ns}/{q}"), message, level)

    # -- topology ---------------------------------------------------------------------------

    async def topology(self, request: Request) -> Response:
        views = await self.service.topology()
        return self.d.render(request, "topology.html", {"views": views, "now": now_ms()})

    def routes(self) -> list[BaseRoute]:
        page = self.d.page
        get: list[tuple[str, Callable[[Request], Awaitable[Response]]]] = [
            ("/timeline/{ns}/{q}", self.timeline),
            ("/panels/charts/{ns}/{q}", self.charts),
            ("/panels/deadgroups/{ns}/{q}", self.dead_groups),
            ("/topology", self.topology),
        ]
        post: list[tuple[str, Callable[[Request], Awaitable[Response]]]] = [
            ("/timeline/{ns}/{q}/reschedule", self.reschedule),
            ("/deadletter/{ns}/{q}/groups/redrive", self.redrive_group),
        ]
        return [
            *(Route(path, page(h), methods=["GET"]) for path, h in get),
            *(Route(path, page(h), methods=["POST"]) for path, h in post),
        ]
