"""A queue's groups in the dashboard: the panel of the groups holding jobs (a fragment the queue
page loads, and again every few seconds; the pages after the first at ``/ui/queue/{ns}/{q}/
groups``) and its actions: a group paused or resumed, its concurrency and rate limits set or
removed. Read and changed through the service (``groups``, ``configure_group``), as
``/api/{ns}/{q}/groups`` does; every change audited, as the other actions are."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from cluster_dq.dashboard import audit
from cluster_dq.dashboard.base import Dashboard, queue_names, ui_url
from cluster_dq.engine.commands import Group, GroupChanges, check_group
from cluster_dq.engine.groups import cursor_of, parse_changes
from cluster_dq.errors import BadRequest
from cluster_dq.http import params
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute

PAGE = 100  # groups a page of the panel shows (about: a scan step may bring a few more)
SCAN_STEPS = 10  # scan steps a page takes at most (a step may find no group at all)
LIMITS = ("concurrency", "rate")


def limits_body(form: FormData) -> dict[str, object] | None:
    """The limits form as the API's change of a group's settings (``parse_changes`` checks
    it): a field left as the page showed it (its hidden ``shown_`` twin) is left alone, so
    that saving one limit does not restart the other rate; an empty field removes its limit.
    None when the form names neither limit."""
    if not any(name in form for name in LIMITS):
        return None
    body: dict[str, object] = {}
    for name in LIMITS:
        raw = form.get(name)
        if raw is None:
            continue
        if not isinstance(raw, str):
            raise BadRequest(f"invalid {name}", name)
        value, shown = raw.strip(), form.get(f"shown_{name}")
        if isinstance(shown, str) and shown.strip() == value:
            continue
        if not value:
            body[name] = None
        elif name == "concurrency":
            number = params.ascii_uint(value)  # anything else: parse_changes names the field
            body[name] = value if number is None else number
        else:
            body[name] = value
    return body


def limits_text(g: Group) -> str:
    concurrency = "none" if g.concurrency is None else str(g.concurrency)
    return f"concurrency limit {concurrency}, rate limit {g.rate.text() if g.rate else 'none'}"


class GroupViews:
    def __init__(self, dashboard: Dashboard) -> None:
        self.d = dashboard
        self.service = dashboard.service

    # -- helpers ----------------------------------------------------------------------------

    def _back(self, request: Request, ns: str, q: str, cursor: int) -> str:
        """The page an action came from: the queue page (the panel's first page) or a later
        page of the groups."""
        if cursor:
            return ui_url(request, f"/queue/{ns}/{q}/groups", cursor=str(cursor))
        return ui_url(request, f"/queue/{ns}/{q}")

    async def _audit(
        self, request: Request, action: str, target: str, outcome: str, pool: str
    ) -> None:
        await audit.record(self.service, self.d.user(request), action, target, outcome, pool)

    async def _page(
        self, route: PoolRoute[RedisPool], ns: str, q: str, cursor: int
    ) -> tuple[list[Group], int]:
        """The groups from ``cursor`` on, by name, about ``PAGE`` of them, and the next page's
        cursor (0: none). A scan step may find none while more follow: steps are taken until
        there are enough, the scan ends, or ``SCAN_STEPS`` were taken."""
        found: list[Group] = []
        for _ in range(SCAN_STEPS):
            cursor, page = await self.service.groups(route, ns, q, cursor, PAGE)
            found += page
            if not cursor or len(found) >= PAGE:
                break
        return sorted(found, key=lambda g: g.name), cursor

    async def _context(self, request: Request) -> dict[str, Any]:
        ns, q = queue_names(request)
        _, route = self.d.route(request)
        cursor = cursor_of(request.query_params.get("cursor"))
        groups, nxt = await self._page(route, ns, q, cursor)
        return {
            "ns": ns,
            "q": q,
            "groups": groups,
            "cursor": cursor,
            "next_url": ui_url(request, f"/queue/{ns}/{q}/groups", cursor=str(nxt))
            if nxt
            else None,
            "first_url": ui_url(request, f"/queue/{ns}/{q}") if cursor else None,
            "src": ui_url(
                request, f"/panels/groups/{ns}/{q}", **({"cursor": str(cursor)} if cursor else {})
            ),
        }

    # -- pages ------------------------------------------------------------------------------

    async def panel(self, request: Request) -> Response:
        """A fragment (the queue page loads it, and again every few seconds): empty when the
        queue's page holds no group."""
        return self.d.render(request, "_panel_groups.html", await self._context(request))

    async def more(self, request: Request) -> Response:
        """A later page of the groups (the panel's "more" link), refreshed as the panel is."""
        return self.d.render(request, "groups.html", await self._context(request))

    # -- actions ----------------------------------------------------------------------------

    async def pause(self, request: Request) -> Response:
        ns, q = queue_names(request)
        group = check_group(request.path_params["group"])
        pool, route = self.d.route(request)
        form = await self.d.action_form(request)
        back = self._back(request, ns, q, cursor_of(form.get("cursor")))
        paused = request.url.path.endswith("/pause")
        action = "group.pause" if paused else "group.resume"
        target = f"{ns}/{q}/{group}"
        self.d.intend(request, action, target, pool)
        await self.service.configure_group(route, ns, q, group, GroupChanges(paused=paused))
        await self._audit(request, action, target, "ok", pool)
        what = "paused: its jobs are held back, the other groups go on" if paused else "resumed"
        return self.d.redirect(back, f"group {group} of {ns}/{q} {what}", "ok")

    async def limits(self, request: Request) -> Response:
        """A group's concurrency and rate limits (``10/1s``, ``600/1m``, ``5/250ms``); an empty
        field removes its limit. A bad value is a 400 naming it, and nothing is changed."""
        ns, q = queue_names(request)
        group = check_group(request.path_params["group"])
        pool, route = self.d.route(request)
        form = await self.d.action_form(request)
        back = self._back(request, ns, q, cursor_of(form.get("cursor")))
        body = limits_body(form)
        if body is None:
            raise BadRequest("nothing to change: give concurrency or rate", "limits")
        changes = parse_changes(body)
        target = f"{ns}/{q}/{group}"
        if not body:
            return self.d.redirect(back, f"group {group}: nothing changed", "info")
        self.d.intend(request, "group.limits", target, pool)
        got = await self.service.configure_group(route, ns, q, group, changes)
        outcome = {"concurrency": got.concurrency, "rate": got.rate.text() if got.rate else None}
        await self._audit(request, "group.limits", target, f"ok: {json.dumps(outcome)}", pool)
        return self.d.redirect(back, f"group {group}: {limits_text(got)}", "ok")

    def routes(self) -> list[BaseRoute]:
        page = self.d.page
        get: list[tuple[str, Callable[[Request], Awaitable[Response]]]] = [
            ("/panels/groups/{ns}/{q}", self.panel),
            ("/queue/{ns}/{q}/groups", self.more),
        ]
        post: list[tuple[str, Callable[[Request], Awaitable[Response]]]] = [
            ("/queue/{ns}/{q}/groups/{group}/pause", self.pause),
            ("/queue/{ns}/{q}/groups/{group}/resume", self.pause),
            ("/queue/{ns}/{q}/groups/{group}/limits", self.limits),
        ]
        return [
            *(Route(path, page(h), methods=["GET"]) for path, h in get),
            *(Route(path, page(h), methods=["POST"]) for path, h in post),
        ]
