"""Defects found by attacking the dashboard's core (views.py), each with the test that failed
before its fix."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from cluster_dq.localredis import Server
from tests.support import ADMIN_AUTH, serve

NS = "core"


def test_a_purge_up_to_an_instant_spares_a_job_that_died_after_it(redis_server: Server) -> None:
    """The dead-letter page's purge with ``to`` = 0.4 ms before a job's death purged it: the
    inclusive bound was rounded up to the job's own millisecond (the client rounds inward)."""
    svc = serve(redis_server.pool_settings())
    try:
        token = httpx.post(
            f"{svc.admin}/token/{NS}", params={"description": "core"}, auth=ADMIN_AUTH
        ).json()["token"]
        with (
            httpx.Client(base_url=svc.base, headers={"X-Token": token}, timeout=30) as api,
            httpx.Client(base_url=svc.admin, auth=ADMIN_AUTH, timeout=30) as ui,
        ):
            jid = api.put(f"/api/{NS}/sweep", content=b"x").json()["job_id"]
            assert api.post(f"/api/{NS}/sweep/job/{jid}/bury").status_code == 200
            died_ms = api.get(f"/api/{NS}/sweep/deadletter/jobs").json()["jobs"][0]["died_at"]
            before = datetime.fromtimestamp((died_ms - 0.4) / 1000, UTC).isoformat()
            ui.get("/ui/audit")
            form = {"csrf": str(ui.cookies.get("dq_csrf")), "to": before}
            assert ui.post(f"/ui/deadletter/{NS}/sweep/purge", data=form).status_code == 303
            size = api.get(f"/api/{NS}/sweep/deadletter/size").json()["size"]
            assert size == 1, "the job that died after 'to' was purged"
    finally:
        svc.stop(timeout=20)


def test_a_settings_form_with_no_field_is_refused_not_saved(redis_server: Server) -> None:
    """A settings POST that names no setting said "settings saved" and audited a change that
    was none; it is a 400 naming what the form takes, and nothing is audited."""
    svc = serve(redis_server.pool_settings())
    try:
        with httpx.Client(base_url=svc.admin, auth=ADMIN_AUTH, timeout=30) as ui:
            ui.get("/ui/audit")
            form = {"csrf": str(ui.cookies.get("dq_csrf"))}
            r = ui.post(f"/ui/queue/{NS}/empty/settings", data=form)
            assert r.status_code == 400 and "nothing to change" in r.text, r.text
            assert "queue.settings" not in ui.get("/ui/audit").text
    finally:
        svc.stop(timeout=20)


def test_a_limit_for_a_token_that_does_not_exist_is_not_found(redis_server: Server) -> None:
    """A limit set or removed for a well-formed token that does not exist answered "limit
    removed" (or stored a limit no request could ever meet); it is a 404, and nothing is
    stored or audited as done."""
    svc = serve(redis_server.pool_settings())
    try:
        with httpx.Client(base_url=svc.admin, auth=ADMIN_AUTH, timeout=30) as ui:
            ui.get("/ui/audit")
            csrf = str(ui.cookies.get("dq_csrf"))
            ghost = "nosuchtoken0000000000000000"
            for fields in ({}, {"read": "10", "write": "5", "interval": "2"}):
                form = {"csrf": csrf, "token": ghost, **fields}
                r = ui.post(f"/ui/tokens/{NS}/limit", data=form)
                assert r.status_code == 404 and "token not found" in r.text, r.text
            assert ui.get(f"/token/{NS}/{ghost}/limit").status_code == 404
            assert "token.limit" not in ui.get("/ui/audit").text
    finally:
        svc.stop(timeout=20)
