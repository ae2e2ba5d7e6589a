"""A queue's last 24 hours in the dashboard: rates per minute, failures and the lateness of
first deliveries, in 5-minute buckets that every instance adds to (``cluster_dq/history.py``),
drawn on the server as SVG. A fragment the queue page loads, and again every minute; read
from the service (``queue_history``), as every page is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from cluster_dq import history
from cluster_dq.clock import now_ms
from cluster_dq.dashboard import times
from cluster_dq.dashboard.base import Dashboard
from cluster_dq.dashboard.charts import polyline
from cluster_dq.http import params

WIDTH = 2 * history.BUCKETS  # px: two per bucket
HEIGHT = 80
TICK_MS = 6 * 3_600_000  # a tick every 6 hours, on the hour (UTC)
LABEL_PX = 56  # a tick's label's width


@dataclass(frozen=True, slots=True)
class Chart:
    """One chart of the panel: its lines (name -> SVG points), the largest value drawn."""

    lines: dict[str, str]
    peak: float


def _chart(points: list[history.Point], names: tuple[str, ...]) -> Chart:
    values = {n: [getattr(p, n) for p in points] for n in names}
    peak = max((v for vs in values.values() for v in vs if v is not None), default=0.0)
    # one scale for every line of a chart: the largest value of any of them
    return Chart({n: polyline(vs, WIDTH, HEIGHT, peak) for n, vs in values.items()}, peak)


def ticks(first_ms: int, now: int) -> list[tuple[float, str, int]]:
    """(x, label, ms) of the chart's time ticks: every 6 h on the hour, UTC (no label where
    it would run past the chart's right edge)."""
    span = history.BUCKETS * history.BUCKET_MS
    out = []
    at = -(-first_ms // TICK_MS) * TICK_MS
    while at <= now:
        x = WIDTH * (at - first_ms) / span
        out.append((x, times.clock(at) if x < WIDTH - LABEL_PX else "", at))
        at += TICK_MS
    return out


def panel(rows: list[list[int]], now: int) -> dict[str, Any]:
    """What the template draws, from the rows of ``history.window(now)``."""
    points = history.series(rows, now)
    first = points[0].start_ms
    return {
        "first_ms": first,
        "now": now,
        "empty": not any(any(r) for r in rows),
        "totals": history.totals(rows),
        "rates": _chart(points, ("published", "delivered", "acked")),
        "failures": _chart(points, ("redelivered", "ttr_expired", "dead", "released")),
        "lateness": _chart(points, ("late_p50_ms", "late_p99_ms", "late_mean_ms")),
        "ticks": ticks(first, now),
        "width": WIDTH,
        "height": HEIGHT,
        "bucket_min": history.BUCKET_MS // 60_000,
        "hours": history.KEEP_MS // 3_600_000,
    }


class HistoryViews:
    def __init__(self, dashboard: Dashboard) -> None:
        self.d = dashboard
        self.service = dashboard.service

    async def history(self, request: Request) -> Response:
        """A fragment (the queue page loads it, and again every minute)."""
        ns, q = request.path_params["ns"], request.path_params["q"]
        params.check_names(ns, q)
        _, route = self.d.route(request)
        now = now_ms()
        rows = await self.service.queue_history(route, ns, q, now)
        context = {"ns": ns, "q": q, **panel(rows, now)}
        return self.d.render(request, "_panel_history.html", context)

    def routes(self) -> list[BaseRoute]:
        return [Route("/panels/history/{ns}/{q}", self.d.page(self.history), methods=["GET"])]
