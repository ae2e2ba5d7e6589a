"""The dashboard's pages (GET) and actions (POST forms, each audited): overview, queue, job,
dead letters, tokens and limits, audit log. Every read and change goes through the service
layer, as the HTTP API's do."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from cluster_dq.clock import now_ms
from cluster_dq.dashboard import audit, inflight, times
from cluster_dq.dashboard.base import Dashboard, queue_names, ui_url
from cluster_dq.engine.control import FOREVER_MS, MAX_DEAD_PAGE, DeadFilter
from cluster_dq.errors import BadRequest, Conflict, NotFound, WrongState
from cluster_dq.http import params
from cluster_dq.models import (
    DEATH_CODES,
    MAX_SECONDS,
    MAX_TRIES,
    UNKNOWN_REASON,
    Job,
    JobSpec,
    JobState,
)
from cluster_dq.pools import RedisPool
from cluster_dq.queueconf import parse_changes
from cluster_dq.routing import PoolRoute
from cluster_dq.tokens import Limit, mask, reference, well_formed

BODY_PREVIEW = 4096  # characters of a body shown
HEADS = 10  # ready and delayed jobs shown on a queue page
DEAD_PAGE = 50
_SECONDS_RE = re.compile(r"[0-9]{1,10}(\.[0-9]{1,3})?")
# What each state allows (the job page offers these buttons, the action checks it again).
ACTIONS: dict[str, tuple[str, ...]] = {
    "ready": ("bury", "reschedule", "cancel"),
    "delayed": ("bury", "reschedule", "cancel"),
    "reserved": ("bury", "ack", "cancel"),
    "dead": ("kick", "cancel"),
}


def seconds(form: FormData, name: str, default_ms: int) -> int:
    """A form's time in seconds (up to 3 decimals) as ms; empty: ``default_ms``."""
    raw = form.get(name)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return default_ms
    if not isinstance(raw, str) or not _SECONDS_RE.fullmatch(raw.strip()):
        raise BadRequest(f"invalid {name}: seconds, e.g. 30 or 1.5", name)
    ms = round(float(raw.strip()) * 1000)
    if ms > MAX_SECONDS * 1000:
        raise BadRequest(f"invalid {name}: at most {MAX_SECONDS} seconds", name)
    return ms


def integer(form: FormData, name: str, default: int, low: int, high: int) -> int:
    raw = form.get(name)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return default
    value = params.ascii_uint(raw.strip()) if isinstance(raw, str) else None
    if value is None or not low <= value <= high:
        raise BadRequest(f"invalid {name}: an integer {low}..{high}", name)
    return value


def text(form: FormData, name: str, limit: int = 1024) -> str:
    raw = form.get(name, "")
    if not isinstance(raw, str):
        raise BadRequest(f"invalid {name}", name)
    if len(raw.encode()) > limit:
        raise BadRequest(f"{name} too long (max {limit} bytes)", name)
    return raw


def moment(form: FormData, name: str, default: int, upper: bool = False) -> int:
    """A time of the form: as the pages show it (``2026-01-31 08:00:00.123 UTC``), an ISO
    date and time (UTC unless it says otherwise), or ms since the epoch (``times.py``);
    empty: ``default``. A bound of a range, both ends inclusive, is rounded inward to the ms:
    up for a lower bound, down for an ``upper`` one (a range never takes in a job that died
    outside it)."""
    raw = form.get(name)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return default
    value = params.ascii_uint(raw.strip()) if isinstance(raw, str) else None
    if value is None and isinstance(raw, str):
        value = times.parse(raw, upper)
    if value is None or not 0 <= value <= FOREVER_MS:
        raise BadRequest(
            f"invalid {name}: a date and time in UTC (as the pages show it), or ms since the epoch",
            name,
        )
    return value


def preview(body: bytes) -> tuple[str, str, bool]:
    """(how, text, truncated): the body as UTF-8 text, else as base64; at most
    ``BODY_PREVIEW`` characters."""
    try:
        shown, how = body.decode(), "text"
    except UnicodeDecodeError:
        shown, how = base64.b64encode(body).decode(), "base64"
    return how, shown[:BODY_PREVIEW], len(shown) > BODY_PREVIEW


class Views:
    def __init__(self, dashboard: Dashboard) -> None:
        self.d = dashboard
        self.service = dashboard.service
        self.settings = dashboard.settings

    # -- helpers ----------------------------------------------------------------------------

    async def _audit(
        self, request: Request, action: str, target: str, outcome: str, pool: str
    ) -> None:
        await audit.record(self.service, self.d.user(request), action, target, outcome, pool)

    # -- overview ---------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        pool, route = self.d.route(request)
        ns = request.query_params.get("ns", "")
        if ns:
            params.check_names(ns)
        cut: set[str] = set()
        rows = await self.d.queue_rows(route, ns, cut=cut)
        namespaces: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            namespaces.setdefault(row["ns"], []).append(row)
        return self.d.render(
            request,
            "overview.html",
            {
                "namespaces": namespaces,
                "ns_filter": ns,
                "cut": cut,
                "max_list": params.MAX_LIST,
                "pools": self.service.token_pools(),
                "events_url": ui_url(request, "/events", **({"ns": ns} if ns else {})),
            },
        )

    # -- queue ------------------------------------------------------------------------------

    async def queue(self, request: Request) -> Response:
        ns, q = queue_names(request)
        pool, route = self.d.route(request)
        sizes = await self.service.sizes(route, ns, q)
        conf = await self.service.queue_settings(route, ns, q)
        ready = await self.service.heads(route, ns, q, JobState.READY, HEADS)
        delayed = await self.service.heads(route, ns, q, JobState.DELAYED, HEADS)
        held = await inflight.in_flight(self.service, route, ns, q)
        rates = self.d.rates.now().get((ns, q), {})
        now = now_ms()
        oldest = ready[0].due_ms if ready else None
        return self.d.render(
            request,
            "queue.html",
            {
                "ns": ns,
                "q": q,
                "sizes": sizes,
                "conf": conf,
                "ready": ready,
                "delayed": delayed,
                "in_flight": held,
                "in_flight_more": max(sizes.reserved - len(held), 0),
                "rates": rates,
                "oldest_due_ms": oldest,
                "lateness_ms": None if oldest is None else max(now - oldest, 0),
                "defaults": {
                    "ttl": self.settings.TTLSecond,
                    "tries": conf.tries or self.settings.TriesNum,
                },
                "events_url": ui_url(request, "/events", ns=ns, q=q),
            },
        )

    async def publish(self, request: Request) -> Response:
        ns, q = queue_names(request)
        pool, route = self.d.route(request)
        form = await self.d.action_form(request)
        body = text(form, "body", self.settings.MaxBodyBytes).encode()
        self.d.intend(request, "job.publish", f"{ns}/{q}", pool)
        conf = await self.service.queue_defaults(route, ns, q)
        spec = JobSpec(
            body,
            delay_ms=seconds(form, "delay", self.settings.DelaySecond * 1000),
            ttl_ms=seconds(form, "ttl", self.settings.TTLSecond * 1000),
            tries=integer(form, "tries", conf.tries or self.settings.TriesNum, 1, MAX_TRIES),
        )
        back = ui_url(request, f"/queue/{ns}/{q}")
        try:
            (published,) = await self.service.publish(route, ns, q, [spec])
        except BadRequest as e:
            await self._audit(request, "job.publish", f"{ns}/{q}", f"refused: {e}", pool)
            raise
        target = f"{ns}/{q}/{published.job_id}"
        await self._audit(request, "job.publish", target, "ok", pool)
        return self.d.redirect(back, f"published job {published.job_id}", "ok")

    async def pause(self, request: Request) -> Response:
        ns, q = queue_names(request)
        pool, route = self.d.route(request)
        await self.d.action_form(request)
        paused = request.url.path.endswith("/pause")
        action = "queue.pause" if paused else "queue.resume"
        self.d.intend(request, action, f"{ns}/{q}", pool)
        back = ui_url(request, f"/queue/{ns}/{q}")
        try:
            await self.service.pause(route, ns, q, paused)
        except NotFound as e:  # a typo: nothing written (the API's create=1 pauses a new queue)
            await self._audit(request, action, f"{ns}/{q}", f"refused: {e}", pool)
            return self.d.redirect(back, str(e), "error")
        await self._audit(request, action, f"{ns}/{q}", "ok", pool)
        what = "paused: nothing is delivered" if paused else "resumed"
        return self.d.redirect(back, f"{ns}/{q} {what}", "ok")

    async def configure(self, request: Request) -> Response:
        """The queue's own settings: ttr (s), tries, max size; an empty field removes it."""
        ns, q = queue_names(request)
        pool, route = self.d.route(request)
        form = await self.d.action_form(request)
        body: dict[str, Any] = {}
        for name, key in (("ttr", "ttr_ms"), ("tries", "tries"), ("max_size", "max_size")):
            raw = form.get(name)
            if raw is None:
                continue
            if isinstance(raw, str) and not raw.strip():
                body[key] = None
            elif name == "ttr":
                body[key] = seconds(form, "ttr", 0)
            else:
                body[key] = integer(form, name, 0, 0, 2**53)
        if not body:
            raise BadRequest("nothing to change: give ttr, tries or max_size", "settings")
        changes = parse_changes(json.dumps(body).encode())
        self.d.intend(request, "queue.settings", f"{ns}/{q}", pool)
        try:
            got = await self.service.configure(route, ns, q, changes)
        except BadRequest as e:
            await self._audit(request, "queue.settings", f"{ns}/{q}", f"refused: {e}", pool)
            raise
        await self._audit(
            request, "queue.settings", f"{ns}/{q}", f"ok: {json.dumps(got.as_json())}", pool
        )
        return self.d.redirect(ui_url(request, f"/queue/{ns}/{q}"), "settings saved", "ok")

    # -- jobs -------------------------------------------------------------------------------

    async def find_job(self, request: Request) -> Response:
        """The search box: ``?ns=&q=&id=`` -> the job's page."""
        qp = request.query_params
        ns, q, jid = qp.get("ns", ""), qp.get("q", ""), qp.get("id", "").strip()
        params.check_names(ns, q)
        params.job_id(jid)
        return self.d.redirect(ui_url(request, f"/job/{ns}/{q}/{quote(jid)}"))

    async def job(self, request: Request) -> Response:
        ns, q = queue_names(request)
        jid = params.job_id(request.path_params["job_id"])
        pool, route = self.d.route(request)
        found = await self.service.peek_job(route, ns, q, jid)
        ctx: dict[str, Any] = {"ns": ns, "q": q, "job_id": jid}
        if not isinstance(found, Job):
            ctx["result"] = found.result.decode(errors="replace")
            ctx["acked_at_ms"] = found.done_ms
            return self.d.render(request, "job.html", ctx)
        how, shown, cut = preview(found.body)
        note = found.note
        ctx.update(
            {
                "job": found,
                "state": str(found.state) if found.state else "",
                "body_how": how,
                "body": shown,
                "body_cut": cut,
                "body_size": len(found.body),
                "progress": found.progress.decode(errors="replace") if found.progress else None,
                "last_error": note.last_error if note else None,
                "dedup_key": found.dedup_key,
                "reason": (note.reason if note else UNKNOWN_REASON)
                if found.state == JobState.DEAD
                else None,
                "died_ms": note.died_ms if note and note.died_ms else None,
                "actions": ACTIONS.get(str(found.state), ()),
                "kick_ttl": self.settings.TTLSecond,
            }
        )
        return self.d.render(request, "job.html", ctx)

    async def job_action(self, request: Request) -> Response:
        """bury, kick, reschedule, cancel, ack: only while the job is in the state the page
        showed, after as many deliveries (hidden fields); a job that moved meanwhile is left
        alone, and the flash says where it is now."""
        ns, q = queue_names(request)
        jid = params.job_id(request.path_params["job_id"])
        action = request.path_params["action"]
        pool, route = self.d.route(request)
        form = await self.d.action_form(request)
        expected = text(form, "state", 16)
        target = f"{ns}/{q}/{jid}"
        job_url = ui_url(request, f"/job/{ns}/{q}/{quote(jid)}")
        queue_url = ui_url(request, f"/queue/{ns}/{q}")
        back = text(form, "back", 16)
        done_url = ui_url(request, f"/deadletter/{ns}/{q}") if back == "deadletter" else job_url
        if action not in ACTIONS.get(expected, ()):
            raise BadRequest(f"cannot {action} a job that is {expected or 'in no state'}", "state")
        # arguments first: a bad one is a 400 before anything is looked at
        reason = text(form, "reason", 1024)
        delay_ms = seconds(form, "delay", 0)
        tries = integer(form, "tries", 1, 1, MAX_TRIES)
        ttl_ms = seconds(form, "ttl", self.settings.TTLSecond * 1000)
        seen = integer(form, "deliveries", -1, 0, MAX_TRIES) if form.get("deliveries") else None
        if action == "kick" and ttl_ms and ttl_ms <= delay_ms:
            raise BadRequest("ttl must be longer than delay", "ttl")

        async def lost(now: str | None) -> Response:
            where = f"it is {now} now" if now else "it is gone (acked, deleted or expired)"
            outcome = f"lost race: {where}"
            await self._audit(request, f"job.{action}", target, outcome, pool)
            message = f"job {jid} was not {_past(action)}: {where}; nothing was changed"
            return self.d.redirect(job_url if now else queue_url, message, "warn")

        self.d.intend(request, f"job.{action}", target, pool)
        try:
            current = await self.service.peek_job(route, ns, q, jid)
        except NotFound:
            return await lost(None)
        if not isinstance(current, Job):
            return await lost("acked")
        if str(current.state) != expected:
            return await lost(str(current.state))
        if seen is not None and current.deliveries != seen:  # taken again since the page
            return await lost(f"{current.state} again (delivery {current.deliveries})")
        try:
            outcome = await self._act(route, action, ns, q, jid, reason, delay_ms, tries, ttl_ms)
        except (WrongState, Conflict) as e:
            return await lost(e.state)
        except NotFound:
            return await lost(None)
        await self._audit(request, f"job.{action}", target, f"ok: {outcome}", pool)
        url = queue_url if outcome in ("deleted", "acked") else done_url
        return self.d.redirect(url, f"job {jid} {outcome}", "ok")

    async def _act(
        self,
        route: PoolRoute[RedisPool],
        action: str,
        ns: str,
        q: str,
        jid: str,
        reason: str,
        delay_ms: int,
        tries: int,
        ttl_ms: int,
    ) -> str:
        """Does one job action; what happened, in words."""
        s = self.service
        if action == "bury":
            await s.bury(route, ns, q, jid, reason)
            return "buried"
        if action == "kick":
            job = await s.kick(route, ns, q, jid, delay_ms, tries, ttl_ms)
            return f"kicked: {job.state}"
        if action == "reschedule":
            job = await s.reschedule(route, ns, q, jid, lambda now: now + delay_ms)
            return f"rescheduled: {job.state}"
        (state,) = await s.ack(route, ns, q, [jid])
        if state is None:
            raise NotFound("job not found")
        return "acked" if action == "ack" else "deleted"

    # -- dead letters -----------------------------------------------------------------------

    async def deadletter(self, request: Request) -> Response:
        ns, q = queue_names(request)
        pool, route = self.d.route(request)
        cursor = request.query_params.get("cursor") or None
        page, nxt = await self.service.dead_jobs(route, ns, q, cursor, DEAD_PAGE)
        sizes = await self.service.sizes(route, ns, q)
        return self.d.render(
            request,
            "deadletter.html",
            {
                "ns": ns,
                "q": q,
                "jobs": page,
                "next_url": ui_url(request, f"/deadletter/{ns}/{q}", cursor=nxt) if nxt else None,
                "sizes": sizes,
                "reasons": [*DEATH_CODES, UNKNOWN_REASON],
                "kick_ttl": self.settings.TTLSecond,
            },
        )

    async def sweep(self, request: Request) -> Response:
        """Filtered redrive or purge (reason, time of death from/to, in ms or as the form's
        datetime-local), walked to the end in bounded steps; the flash says how many."""
        ns, q = queue_names(request)
        pool, route = self.d.route(request)
        form = await self.d.action_form(request)
        redrive = request.url.path.endswith("/redrive")
        reason = text(form, "reason", 64) or None
        if reason is not None and reason not in DEATH_CODES and reason != UNKNOWN_REASON:
            raise BadRequest("invalid reason", "reason")
        start = moment(form, "from", 0)
        end = moment(form, "to", FOREVER_MS, upper=True)
        if start > end:
            raise BadRequest("invalid range: from is after to", "from")
        filt = DeadFilter(reason, start, end)
        tries = integer(form, "tries", 1, 1, MAX_TRIES)
        ttl_ms = self.settings.TTLSecond * 1000
        what = "redriven" if redrive else "purged"
        described = f"reason={reason or 'any'} from={times.shown(start)} to={times.shown(end)}"
        self.d.intend(request, f"deadletter.{what[:-1]}", f"{ns}/{q} {described}", pool)
        total, cursor, steps = 0, None, 0
        while True:
            if redrive:
                n, cursor = await self.service.redrive(
                    route, ns, q, filt, cursor, MAX_DEAD_PAGE, 0, tries, ttl_ms
                )
            else:
                n, cursor = await self.service.purge(route, ns, q, filt, cursor, MAX_DEAD_PAGE)
            total, steps = total + n, steps + 1
            if cursor is None or steps >= 1000:
                break
        more = "" if cursor is None else " (stopped after 1000 steps: run it again)"
        await self._audit(
            request, f"deadletter.{what[:-1]}", f"{ns}/{q} {described}", f"ok: {total}", pool
        )
        message = f"{total} dead job(s) {what}{more}"
        return self.d.redirect(ui_url(request, f"/deadletter/{ns}/{q}"), message, "ok")

    # -- tokens and limits ------------------------------------------------------------------

    async def tokens(self, request: Request) -> Response:
        """A namespace's tokens, each masked (``tokens.mask``) with its description, limit
        and the opaque reference its row's actions carry (no page holds a token in full). A
        read-only page has no actions, and no references: a reference is a hash of the token,
        and a token a person chose can be guessed from it offline."""
        ns = request.query_params.get("ns", "")
        pool, _ = self.d.route(request)
        rows: list[dict[str, Any]] = []
        if ns:
            params.check_names(ns)
            found = await self.service.list_tokens(pool, ns)
            every = await self.service.token_limits(force=True)
            for t, desc in sorted(found.items(), key=lambda kv: (kv[1], kv[0])):
                rows.append(
                    {
                        "masked": mask(t),
                        "ref": None if self.d.read_only else reference(pool, ns, t),
                        "description": desc,
                        "limit": every.get(f"{pool}/{ns}/{t}"),
                    }
                )
        return self.d.render(request, "tokens.html", {"ns": ns, "tokens": rows})

    async def token_action(self, request: Request) -> Response:
        ns = request.path_params["ns"]
        params.check_names(ns)
        pool, _ = self.d.route(request)
        form = await self.d.action_form(request)
        service = self.service
        back = ui_url(request, "/tokens", ns=ns)
        action = request.path_params["action"]
        self.d.intend(request, f"token.{action}", f"{ns} (pool {pool})", pool)
        if action == "create":
            description = text(form, "description", 1024).strip()
            if not description:
                raise BadRequest("a description is required", "description")
            custom = text(form, "token", 64).strip() or None
            token = await service.create_token(pool, ns, description, custom)
            await self._audit(request, "token.create", f"{ns}/{mask(token)}", "ok", pool)
            # the one time the dashboard shows a token in full (a flash: once, never stored)
            return self.d.redirect(back, f"token created: {token}", "ok")
        # a row's reference (the tokens page), or the token itself (typed by an operator)
        ref = text(form, "ref", 64).strip()
        if ref:
            token = await service.token_by_reference(pool, ns, ref)
        else:
            token = text(form, "token", 64)
            if not well_formed(pool, token):
                raise BadRequest("invalid token", "token")
        if action == "delete":
            await service.delete_token(pool, ns, token)
            await self._audit(request, "token.delete", f"{ns}/{mask(token)}", "ok", pool)
            return self.d.redirect(back, "token deleted", "ok")
        if action == "limit":
            if not await service.token_exists(pool, ns, token):  # a limit it could never apply to
                raise NotFound("token not found")
            raw = {k: form.get(k, "") for k in ("read", "write", "interval")}
            if not any(isinstance(v, str) and v.strip() for v in raw.values()):
                await service.delete_token_limit(pool, ns, token)
                outcome = "removed"
            else:
                limit = Limit.parse(
                    {
                        k: integer(form, k, 0, 0, 2**31 - 1)
                        if k != "interval"
                        else integer(form, k, 1, 1, 2_592_000)
                        for k in raw
                    }
                )
                await service.set_token_limit(pool, ns, token, limit, create=False)
                outcome = json.dumps(limit.as_json())
            await self._audit(request, "token.limit", f"{ns}/{mask(token)}", f"ok: {outcome}", pool)
            return self.d.redirect(back, f"limit {outcome}", "ok")
        raise NotFound("no such action")

    # -- audit ------------------------------------------------------------------------------

    async def audit_page(self, request: Request) -> Response:
        return self.d.render(request, "audit.html", {"entries": await audit.entries(self.service)})

    def routes(self) -> list[BaseRoute]:
        page = self.d.page
        get: list[tuple[str, Callable[[Request], Awaitable[Response]]]] = [
            ("/", self.overview),
            ("/queue/{ns}/{q}", self.queue),
            ("/job", self.find_job),
            ("/job/{ns}/{q}/{job_id}", self.job),
            ("/deadletter/{ns}/{q}", self.deadletter),
            ("/tokens", self.tokens),
            ("/audit", self.audit_page),
        ]
        post: list[tuple[str, Callable[[Request], Awaitable[Response]]]] = [
            ("/queue/{ns}/{q}/publish", self.publish),
            ("/queue/{ns}/{q}/pause", self.pause),
            ("/queue/{ns}/{q}/resume", self.pause),
            ("/queue/{ns}/{q}/settings", self.configure),
            ("/job/{ns}/{q}/{job_id}/{action:str}", self.job_action),
            ("/deadletter/{ns}/{q}/redrive", self.sweep),
            ("/deadletter/{ns}/{q}/purge", self.sweep),
            ("/tokens/{ns}/{action:str}", self.token_action),
        ]
        return [
            *(Route(path, page(h), methods=["GET"]) for path, h in get),
            *(Route(path, page(h), methods=["POST"]) for path, h in post),
        ]


def _past(action: str) -> str:
    return {
        "bury": "buried",
        "kick": "kicked",
        "reschedule": "rescheduled",
        "cancel": "deleted",
        "ack": "acked",
    }.get(action, action)
