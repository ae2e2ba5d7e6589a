"""Who is running what, in the dashboard: a namespace's workers (each one's host, pid, queues,
concurrency, when it started and was last seen) and the jobs each holds, with how long it has
held them; ``?q=`` narrows the held jobs to one queue's (the queue page links here). Read from
the service (``list_workers``), as the data port's ``GET /api/{ns}/_workers`` does."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from cluster_dq.clock import now_ms
from cluster_dq.dashboard.base import Dashboard
from cluster_dq.http import params


class WorkerViews:
    def __init__(self, dashboard: Dashboard) -> None:
        self.d = dashboard
        self.service = dashboard.service

    async def workers(self, request: Request) -> Response:
        ns = request.query_params.get("ns", "")
        q = request.query_params.get("q") or None
        found: list[dict[str, Any]] = []
        truncated = False
        if ns:
            params.check_names(ns, q)
            _, route = self.d.route(request)
            found, truncated = await self.service.list_workers(route, ns)
            if q is not None:  # the workers holding jobs of that queue, and only those jobs
                found = [
                    {**w, "in_flight": [j for j in w.get("in_flight", []) if j["queue"] == q]}
                    for w in found
                ]
                found = [w for w in found if w["in_flight"]]
        now = now_ms()
        context = {"ns": ns, "q": q, "workers": found, "now": now, "truncated": truncated}
        return self.d.render(request, "workers.html", context)

    def routes(self) -> list[BaseRoute]:
        return [Route("/workers", self.d.page(self.workers), methods=["GET"])]
