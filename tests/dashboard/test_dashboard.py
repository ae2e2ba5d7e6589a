"""The web dashboard (admin port, /ui) through real HTTP against a `cluster-dq serve` process
on each topology: the pages show what the queues hold, every action changes the job and is
audited, CSRF, read-only and basic auth refuse what they must (changing nothing), a lost race
changes nothing and says where the job is, and the live stream neither lies nor holds up a
graceful stop."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis

from cluster_dq.engine.commands import EngineConfig
from cluster_dq.keys import QueueKeys
from cluster_dq.localredis import Server, free_port, start_server
from cluster_dq.models import JobSpec, JobState
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import Settings
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH, Deployment, serve
from tests.support.dashboard import (
    NS,
    audit_rows,
    consume,
    csrf,
    error_message,
    flash,
    post,
    publish,
    shown_sizes,
    sizes,
    state_of,
)

# -- pages --------------------------------------------------------------------------------------


def test_pages_show_what_the_queues_hold(api: httpx.Client, ui: httpx.Client) -> None:
    ready = [publish(api, "orders", b"r%d" % i) for i in range(3)]
    later = publish(api, "orders", delay=600)
    sooner = publish(api, "orders", delay=60)
    held = consume(api, "orders")["job_id"]
    dead = consume(api, "orders")["job_id"]
    assert api.post(f"/api/{NS}/orders/job/{dead}/bury", params={"reason": "x"}).status_code == 200
    publish(api, "mails")
    expected = {"ready": 1, "delayed": 2, "reserved": 1, "dead": 1}

    overview = ui.get("/")
    assert overview.status_code == 200
    assert shown_sizes(overview.text, f"{NS}/orders") == expected
    assert shown_sizes(overview.text, f"{NS}/mails") == {
        "ready": 1,
        "delayed": 0,
        "reserved": 0,
        "dead": 0,
    }
    page = ui.get(f"/queue/{NS}/orders")
    assert page.status_code == 200
    assert shown_sizes(page.text, f"{NS}/orders") == expected
    head = re.findall(r'data-job-id="(\w+)" data-state="(\w+)"', page.text)
    assert head == [(ready[2], "ready"), (sooner, "delayed"), (later, "delayed")]
    assert held == ready[0] and dead == ready[1]
    assert 'id="publish-form"' in page.text and 'id="pause-form"' in page.text


def test_the_job_page_shows_the_job(api: httpx.Client, ui: httpx.Client) -> None:
    text_id = publish(api, "jobs", "héllo <b>".encode(), tries=3)
    binary_id = publish(api, "jobs", b"\xff\x00\xfe", delay=30)
    consume(api, "jobs")
    page = ui.get(f"/job/{NS}/jobs/{text_id}")
    assert page.status_code == 200
    assert 'data-state="reserved"' in page.text
    assert "héllo &lt;b&gt;" in page.text  # escaped, never markup
    assert re.search(r'id="job-deliveries">1<', page.text)
    assert re.search(r'id="job-tries">2<', page.text)
    assert re.findall(r'data-action="(\w+)"', page.text) == ["bury", "ack", "cancel"]
    page = ui.get(f"/job/{NS}/jobs/{binary_id}")
    assert 'data-encoding="base64"' in page.text and "/wD+" in page.text
    assert re.findall(r'data-action="(\w+)"', page.text) == ["bury", "reschedule", "cancel"]
    found = ui.get("/job", params={"ns": NS, "q": "jobs", "id": binary_id})
    assert found.status_code == 200 and f'data-job-id="{binary_id}"' in found.text
    assert 'id="job-dedup-key"' not in found.text
    keyed = publish(api, "jobs", b"k", dedup_key="order-7", delay=30)
    page = ui.get(f"/job/{NS}/jobs/{keyed}")
    assert re.search(r'id="job-dedup-key">order-7<', page.text)


def test_a_ready_jobs_due_time_is_its_due_time_whatever_its_priority(
    api: httpx.Client, ui: httpx.Client
) -> None:
    """A ready job's score carries its priority above its due ms: the job page showed a job of
    priority below 255 as due in the year ~37,565 (the score unmasked)."""
    before = int(time.time() * 1000)
    jobs = {prio: publish(api, "prio", b"x", priority=prio) for prio in (0, 100, 255)}
    after = int(time.time() * 1000)
    for prio, jid in jobs.items():
        page = ui.get(f"/job/{NS}/prio/{jid}")
        assert page.status_code == 200 and 'data-state="ready"' in page.text
        due = re.search(r'id="job-due"><time[^>]* data-ms="(\d+)"', page.text)
        assert due is not None, page.text
        assert before - 1000 <= int(due.group(1)) <= after + 1000, (prio, due.group(1))
    queue = ui.get(f"/queue/{NS}/prio")  # the ready heads, in delivery order
    shown = [int(ms) for ms in re.findall(r'due <time[^>]* data-ms="(\d+)"', queue.text)]
    assert len(shown) == 3 and all(before - 1000 <= ms <= after + 1000 for ms in shown)
    listed = api.get(f"/api/{NS}").json()["queues"]
    (row,) = [r for r in listed if r["queue"] == "prio"]
    assert before - 1000 <= row["oldest_due_ms"] <= after + 1000


# -- actions ------------------------------------------------------------------------------------


def test_the_publish_form_publishes_a_job(api: httpx.Client, ui: httpx.Client) -> None:
    r = post(ui, f"/queue/{NS}/forms/publish", body="hi there", delay="30", ttl="100", tries="4")
    assert r.status_code == 200
    jid = re.search(r"published job (\w+)", flash(r))
    assert jid is not None
    job = api.get(f"/api/{NS}/forms/job/{jid.group(1)}").json()
    assert job["state"] == "delayed" and job["remain_tries"] == 4 and 95 <= job["ttl"] <= 100
    assert sizes(api, "forms")["delayed"] == 1
    (entry,) = audit_rows(ui)
    assert entry == {
        "user": "admin",
        "action": "job.publish",
        "target": f"{NS}/forms/{jid.group(1)}",
        "outcome": "ok",
    }


def test_every_job_action_changes_the_job_and_is_audited(
    api: httpx.Client, ui: httpx.Client
) -> None:
    q = "acts"
    to_bury = publish(api, q)
    r = post(ui, f"/job/{NS}/{q}/{to_bury}/bury", state="ready", reason="bad input")
    assert "buried" in flash(r)
    got = api.get(f"/api/{NS}/{q}/job/{to_bury}").json()
    assert (got["state"], got["reason"], got["last_error"]) == ("dead", "buried", "bad input")

    r = post(ui, f"/job/{NS}/{q}/{to_bury}/kick", state="dead", delay="60", tries="3")
    assert "kicked" in flash(r)
    got = api.get(f"/api/{NS}/{q}/job/{to_bury}").json()
    assert (got["state"], got["remain_tries"]) == ("delayed", 3)

    r = post(ui, f"/job/{NS}/{q}/{to_bury}/reschedule", state="delayed", delay="0")
    assert "rescheduled" in flash(r)
    assert state_of(api, q, to_bury) == "ready"

    r = post(ui, f"/job/{NS}/{q}/{to_bury}/cancel", state="ready")
    assert "deleted" in flash(r)
    assert state_of(api, q, to_bury) is None

    to_ack = publish(api, q)
    consume(api, q)
    r = post(ui, f"/job/{NS}/{q}/{to_ack}/ack", state="reserved")
    assert "acked" in flash(r)
    assert state_of(api, q, to_ack) is None
    assert sizes(api, q) == {"size": 0, "delayed": 0, "reserved": 0, "dead": 0}

    rows = audit_rows(ui)
    assert [(e["action"], e["target"]) for e in rows] == [
        ("job.ack", f"{NS}/{q}/{to_ack}"),
        ("job.cancel", f"{NS}/{q}/{to_bury}"),
        ("job.reschedule", f"{NS}/{q}/{to_bury}"),
        ("job.kick", f"{NS}/{q}/{to_bury}"),
        ("job.bury", f"{NS}/{q}/{to_bury}"),
    ]
    assert all(e["outcome"].startswith("ok") and e["user"] == "admin" for e in rows)


def test_pausing_a_queue_that_does_not_exist_flashes_an_error_and_writes_nothing(
    api: httpx.Client, ui: httpx.Client, sync_redis: redis.Redis
) -> None:
    for verb in ("pause", "resume"):
        r = post(ui, f"/queue/{NS}/nosuch/{verb}")
        assert r.status_code == 200 and 'data-level="error"' in r.text, r.text
        assert f"{NS}/nosuch" in flash(r) and "not found" in flash(r), flash(r)
    assert sync_redis.exists(QueueKeys(NS, "nosuch").conf) == 0
    assert api.get(f"/api/{NS}/nosuch/settings").json()["paused"] is False
    outcomes = [e["outcome"] for e in audit_rows(ui)]
    assert all(o.startswith("refused") for o in outcomes[:2]), outcomes


def test_pause_resume_and_queue_settings(api: httpx.Client, ui: httpx.Client) -> None:
    q = "ctl"
    publish(api, q)
    r = post(ui, f"/queue/{NS}/{q}/pause")
    assert "paused" in flash(r) and 'id="resume-form"' in r.text
    assert api.get(f"/api/{NS}/{q}/settings").json()["paused"] is True
    assert api.get(f"/api/{NS}/{q}").status_code == 404  # nothing delivered while paused
    r = post(ui, f"/queue/{NS}/{q}/resume")
    assert api.get(f"/api/{NS}/{q}/settings").json()["paused"] is False
    r = post(ui, f"/queue/{NS}/{q}/settings", ttr="2.5", tries="7", max_size="")
    assert "settings saved" in flash(r)
    got = api.get(f"/api/{NS}/{q}/settings").json()
    assert (got["ttr_ms"], got["tries"], got["max_size"]) == (2500, 7, None)
    r = post(ui, f"/queue/{NS}/{q}/settings", ttr="", tries="0", max_size="")
    assert r.status_code == 400 and "tries" in error_message(r)
    assert api.get(f"/api/{NS}/{q}/settings").json()["tries"] == 7
    actions = [e["action"] for e in audit_rows(ui)]
    assert actions[-3:] == ["queue.settings", "queue.resume", "queue.pause"]


def test_dead_letters_listed_redriven_and_purged_by_filter(
    api: httpx.Client, ui: httpx.Client
) -> None:
    q = "dlq"
    buried = []
    for i in range(3):
        jid = publish(api, q, b"b%d" % i)
        api.post(f"/api/{NS}/{q}/job/{jid}/bury", params={"reason": f"bad {i}"})
        buried.append(jid)
    released = publish(api, q, tries=1)
    consume(api, q)
    r = api.post(f"/api/{NS}/{q}/job/{released}/release", params={"error": "boom"})
    assert r.status_code in (200, 204), r.text
    other = api.get(f"/api/{NS}/{q}/job/{released}").json()["reason"]
    assert other != "buried"

    page = ui.get(f"/deadletter/{NS}/{q}")
    rows = dict(re.findall(r'<tr data-job-id="(\w+)" data-reason="(\w+)"', page.text))
    assert rows == {**dict.fromkeys(buried, "buried"), released: other}
    assert "bad 1" in page.text and "boom" in page.text

    page = ui.get(f"/job/{NS}/{q}/{buried[1]}")
    assert re.search(r'id="job-reason">buried<', page.text)
    assert re.search(r'id="job-last-error">bad 1<', page.text)
    assert re.findall(r'data-action="(\w+)"', page.text) == ["kick", "cancel"]

    r = post(ui, f"/job/{NS}/{q}/{buried[0]}/kick", state="dead", back="deadletter")
    assert r.url.path.endswith(f"/deadletter/{NS}/{q}") and "kicked" in flash(r)
    assert state_of(api, q, buried[0]) == "ready"
    r = post(ui, f"/job/{NS}/{q}/{buried[0]}/bury", state="ready", reason="again")
    assert state_of(api, q, buried[0]) == "dead"

    r = post(ui, f"/deadletter/{NS}/{q}/redrive", reason="buried", tries="2")
    assert flash(r).startswith("3 dead job(s) redriven")
    assert sizes(api, q) == {"size": 3, "delayed": 0, "reserved": 0, "dead": 1}
    r = post(ui, f"/deadletter/{NS}/{q}/purge", reason="buried")
    assert flash(r).startswith("0 dead job(s) purged")
    r = post(ui, f"/deadletter/{NS}/{q}/purge", reason=other, to="2000-01-01T00:00")
    assert flash(r).startswith("0 dead job(s) purged")  # it died after that
    r = post(ui, f"/deadletter/{NS}/{q}/purge", reason=other, to="2200-01-01T00:00")
    assert flash(r).startswith("1 dead job(s) purged")
    assert sizes(api, q)["dead"] == 0
    outcomes = [(e["action"], e["outcome"]) for e in audit_rows(ui)[:4]]
    assert outcomes == [
        ("deadletter.purge", "ok: 1"),
        ("deadletter.purge", "ok: 0"),
        ("deadletter.purge", "ok: 0"),
        ("deadletter.redrive", "ok: 3"),
    ]


UTC_SHOWN = re.compile(
    r'<time datetime="(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)" data-ms="(\d+)">'
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) UTC</time>"
)


def shown_times(page: str) -> list[tuple[int, str]]:
    """Every time a page shows, as (ms, its text): each one UTC, labelled, its ISO-8601 form
    in ``datetime`` and its ms in ``data-ms`` agreeing; no <time> shown any other way."""
    found = UTC_SHOWN.findall(page)
    assert len(found) == page.count("<time"), page
    out = []
    for iso, ms, text in found:
        at = datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc)
        assert iso == at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(ms) % 1000:03d}Z"
        assert text == iso[:-1].replace("T", " ")
        out.append((int(ms), text + " UTC"))
    return out


def test_times_are_utc_and_labelled_and_the_sweep_form_takes_what_pages_show(
    api: httpx.Client, ui: httpx.Client
) -> None:
    """Pages showed browser-local times with no zone, the purge form took UTC and the audit
    log epoch ms: an operator who copied a time purged the wrong window. Every page shows UTC
    ISO-8601 labelled "UTC", and the form takes what a page shows."""
    q = "times"
    first = publish(api, q, b"a")
    api.post(f"/api/{NS}/{q}/job/{first}/bury", params={"reason": "one"})
    time.sleep(0.005)  # two times of death, at least a ms apart
    second = publish(api, q, b"b")
    api.post(f"/api/{NS}/{q}/job/{second}/bury", params={"reason": "two"})
    died = {jid: api.get(f"/api/{NS}/{q}/job/{jid}").json()["died_at"] for jid in (first, second)}
    assert died[first] < died[second]

    page = ui.get(f"/deadletter/{NS}/{q}").text
    shown = dict(shown_times(page))
    assert set(shown) >= set(died.values())
    assert "(UTC" in page  # the form's fields say which zone they take
    job_page = ui.get(f"/job/{NS}/{q}/{second}").text
    assert died[second] in dict(shown_times(job_page))

    # the second one's time of death as the page shows it: from there on, only it is purged
    r = post(ui, f"/deadletter/{NS}/{q}/purge", **{"from": shown[died[second]]})
    assert flash(r).startswith("1 dead job(s) purged"), flash(r)
    assert state_of(api, q, first) == "dead" and state_of(api, q, second) is None
    # and up to the first one's (inclusive), as the ISO form of its datetime attribute
    iso = datetime.fromtimestamp(died[first] / 1000, tz=timezone.utc).isoformat()
    r = post(ui, f"/deadletter/{NS}/{q}/purge", to=iso.replace("+00:00", "Z"))
    assert flash(r).startswith("1 dead job(s) purged"), flash(r)

    audit = ui.get("/audit").text
    times = shown_times(audit)
    assert len(times) == len(audit_rows(ui)) >= 2
    (target,) = [e["target"] for e in audit_rows(ui) if e["action"] == "deadletter.purge"][1:]
    assert f"from={shown[died[second]]}" in target, target  # not epoch ms


def test_tokens_created_limited_and_deleted(api: httpx.Client, ui: httpx.Client) -> None:
    r = post(ui, f"/tokens/{NS}/create", description="ui made")
    token = re.search(r"token created: (\S+)", flash(r))
    assert token is not None
    t = token.group(1)
    assert api.get(f"/api/{NS}/q/size", headers={"X-Token": t}).status_code == 200
    r = post(ui, f"/tokens/{NS}/limit", token=t, read="10", write="5", interval="2")
    assert "limit" in flash(r)
    got = httpx.get(
        f"{ui.base_url.scheme}://{ui.base_url.netloc.decode()}/token/{NS}/{t}/limit",
        auth=ADMIN_AUTH,
    ).json()
    assert got == {"read": 10, "write": 5, "interval": 2}
    page = ui.get("/tokens", params={"ns": NS})
    assert f"<code>{t[:6]}…</code>" in page.text and "ui made" in page.text
    assert t not in page.text  # masked; its row's actions name it by an opaque reference
    found = re.search(r'<tr data-ref="(\w+)">\s*<td><code>[^<]*</code></td><td>ui made', page.text)
    assert found is not None
    post(ui, f"/tokens/{NS}/delete", ref=found.group(1))
    assert found.group(1) not in ui.get("/tokens", params={"ns": NS}).text
    assert api.get(f"/api/{NS}/q/size", headers={"X-Token": t}).status_code == 401
    assert [e["action"] for e in audit_rows(ui)] == ["token.delete", "token.limit", "token.create"]


# -- races and bad input ------------------------------------------------------------------------


def test_an_action_that_lost_a_race_changes_nothing_and_says_where_the_job_is(
    api: httpx.Client, ui: httpx.Client
) -> None:
    q = "race"
    jid = publish(api, q)
    lease = consume(api, q)["lease"]
    page = ui.get(f"/job/{NS}/{q}/{jid}")
    assert 'data-action="bury"' in page.text  # the operator sees a reserved job, with bury
    assert api.delete(f"/api/{NS}/{q}/job/{jid}", params={"lease": lease}).status_code == 204
    r = post(ui, f"/job/{NS}/{q}/{jid}/bury", state="reserved", reason="too late")
    assert "was not buried" in flash(r) and "gone" in flash(r)
    assert state_of(api, q, jid) is None
    assert sizes(api, q) == {"size": 0, "delayed": 0, "reserved": 0, "dead": 0}

    moved = publish(api, q)
    page = ui.get(f"/job/{NS}/{q}/{moved}")
    assert 'data-action="reschedule"' in page.text  # ready, as the page was loaded
    consume(api, q)  # meanwhile a consumer takes it
    r = post(ui, f"/job/{NS}/{q}/{moved}/reschedule", state="ready", delay="60")
    assert "was not rescheduled" in flash(r) and "it is reserved now" in flash(r)
    assert state_of(api, q, moved) == "reserved"
    again = publish(api, q, tries=2)
    api.get(f"/api/{NS}/{q}", params={"ttr_ms": 1000})  # its first delivery will time out
    page = ui.get(f"/job/{NS}/{q}/{again}")
    form = re.search(r'id="action-ack".*?</form>', page.text, re.S)
    assert form is not None and 'name="deliveries" value="1"' in form.group(0)
    taken = api.get(f"/api/{NS}/{q}", params={"ttr": 60, "timeout": 10}).json()
    assert (taken["job_id"], taken["deliveries"]) == (again, 2)  # another consumer holds it
    r = post(ui, f"/job/{NS}/{q}/{again}/ack", state="reserved", deliveries="1")
    assert "was not acked: it is reserved again (delivery 2)" in flash(r)
    assert state_of(api, q, again) == "reserved"
    outcomes = [e["outcome"] for e in audit_rows(ui)][1:]
    assert outcomes == [
        "lost race: it is reserved now",
        "lost race: it is gone (acked, deleted or expired)",
    ]


@pytest.mark.parametrize(
    ("method", "path", "form", "status", "says"),
    [
        ("GET", "/queue/shop/bad!name", None, 400, "queue name"),
        ("GET", "/queue/shop/q?pool=nope", None, 404, "pool not found"),
        (
            "GET",
            "/job/shop/q/not-a-job-id-because-it-is-way-too-long-" + "x" * 64,
            None,
            400,
            "job id",
        ),
        ("GET", "/job/shop/q/01M84CYQJ90007ZG2JKZ9W9AQM", None, 404, "job not found"),
        ("GET", "/deadletter/shop/q?cursor=zz", None, 400, "cursor"),
        ("GET", "/nowhere", None, 404, "no such page"),
        ("GET", "/queue/shop/q/publish", None, 405, "POST"),
        ("POST", "/queue/shop/q/publish", {"body": "x", "delay": "soon"}, 400, "invalid delay"),
        ("POST", "/queue/shop/q/publish", {"body": "x", "delay": "9", "ttl": "5"}, 400, "ttl"),
        ("POST", "/queue/shop/q/publish", {"body": "x", "tries": "0"}, 400, "tries"),
        ("POST", "/job/shop/q/01M84CYQJ90007ZG2JKZ9W9AQM/kick", {"state": "ready"}, 400, "kick"),
        ("POST", "/deadletter/shop/q/purge", {"reason": "nope"}, 400, "reason"),
        ("POST", "/deadletter/shop/q/redrive", {"from": "yesterday"}, 400, "invalid from"),
        ("POST", "/tokens/shop/create", {"description": ""}, 400, "description"),
    ],
)
def test_bad_input_is_a_clear_error_page(
    api: httpx.Client,
    ui: httpx.Client,
    method: str,
    path: str,
    form: dict[str, str] | None,
    status: int,
    says: str,
) -> None:
    if method == "GET":
        r = ui.get(path)
    else:
        r = post(ui, path, **(form or {}))
    assert r.status_code == status, r.text
    assert says in error_message(r)
    assert sizes(api, "q") == {"size": 0, "delayed": 0, "reserved": 0, "dead": 0}


def test_what_a_request_carries_is_escaped_on_every_page(ui: httpx.Client) -> None:
    r = ui.get("/", params={"pool": '"><script>alert(1)</script>'})
    assert r.status_code == 404 and "pool not found" in error_message(r)
    assert "<script>alert" not in r.text
    r = ui.get("/job", params={"ns": NS, "q": "q", "id": "<img src=x>"})
    assert r.status_code == 400 and "<img" not in r.text


# -- security -----------------------------------------------------------------------------------


def test_an_action_without_the_csrf_token_is_refused_and_changes_nothing(
    api: httpx.Client, ui: httpx.Client
) -> None:
    q = "csrf"
    jid = publish(api, q)
    target = f"/job/{NS}/{q}/{jid}/bury"
    refused = [
        ui.post(target, data={"state": "ready"}),  # no token
        ui.post(target, data={"state": "ready", "csrf": "x" * 43}),  # a wrong one
        ui.post(target, data={"state": "ready", "csrf": ""}),
        ui.post(  # the right one, from another site
            target,
            data={"state": "ready", "csrf": csrf(ui)},
            headers={"Origin": "https://evil.example"},
        ),
    ]
    with httpx.Client(auth=ADMIN_AUTH) as stranger:  # the right form token, no cookie
        refused.append(
            stranger.post(str(ui.base_url).rstrip("/") + target, data={"csrf": csrf(ui)})
        )
    assert [r.status_code for r in refused] == [403] * 5
    assert "CSRF" in error_message(refused[0]) and "cross-origin" in error_message(refused[3])
    assert state_of(api, q, jid) == "ready"
    assert audit_rows(ui) == []


def test_the_csrf_cookie_is_strict_and_http_only(service: ServiceProcess) -> None:
    r = httpx.get(f"{service.admin}/ui/audit", auth=ADMIN_AUTH)
    (cookie,) = [h for h in r.headers.get_list("set-cookie") if h.startswith("dq_csrf=")]
    attrs = {a.strip().lower() for a in cookie.split(";")}
    assert {"httponly", "samesite=strict", "path=/ui"} <= attrs
    again = httpx.get(f"{service.admin}/ui/audit", auth=ADMIN_AUTH, cookies=r.cookies)
    assert "dq_csrf" not in again.headers.get("set-cookie", "")  # the session keeps its token


def test_basic_auth_is_required(service: ServiceProcess) -> None:
    for path in ("/ui/", "/ui/audit", "/ui/static/dashboard.js", "/ui/events"):
        r = httpx.get(f"{service.admin}{path}")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
        r = httpx.get(f"{service.admin}{path}", auth=("admin", "wrong"))
        assert r.status_code == 401
    r = httpx.post(f"{service.admin}/ui/queue/{NS}/q/publish", data={"body": "x"})
    assert r.status_code == 401
    assert httpx.get(f"{service.admin}/ui/audit", auth=ADMIN_AUTH).status_code == 200


@pytest.fixture(scope="module")
def read_only(deployment: Deployment) -> Iterator[ServiceProcess]:
    svc = serve(deployment.pool_settings(), CLUSTER_DQ_DASHBOARDREADONLY="true")
    yield svc
    svc.stop(timeout=20)


def test_read_only_mode_hides_the_actions_and_refuses_them(
    api: httpx.Client, read_only: ServiceProcess
) -> None:
    q = "ro"
    jid = publish(api, q)
    with httpx.Client(
        base_url=f"{read_only.admin}/ui", auth=ADMIN_AUTH, follow_redirects=True
    ) as ro:
        pages = [ro.get(p).text for p in (f"/queue/{NS}/{q}", f"/job/{NS}/{q}/{jid}")]
        assert all("read-only" in p for p in pages)
        assert not any("<form" in p and 'method="post"' in p for p in pages)
        assert str(sizes(api, q)["size"]) in pages[0]
        token = ro.cookies["dq_csrf"]
        for path, form in [
            (f"/job/{NS}/{q}/{jid}/bury", {"state": "ready"}),
            (f"/job/{NS}/{q}/{jid}/cancel", {"state": "ready"}),
            (f"/queue/{NS}/{q}/publish", {"body": "x"}),
            (f"/queue/{NS}/{q}/pause", {}),
            (f"/tokens/{NS}/create", {"description": "x"}),
        ]:
            r = ro.post(path, data={"csrf": token, **form})
            assert r.status_code == 403 and "read-only" in error_message(r)
        assert ro.get("/audit").text.count("<tr data-action") == 0
    assert state_of(api, q, jid) == "ready"
    assert sizes(api, q) == {"size": 1, "delayed": 0, "reserved": 0, "dead": 0}
    assert api.get(f"/api/{NS}/{q}/settings").json()["paused"] is False


# -- live updates -------------------------------------------------------------------------------


def first_event(client: httpx.Client, url: str, **query: str) -> dict[str, Any]:
    with client.stream("GET", url, params=query) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "sizes":
                return json.loads(line[6:])  # type: ignore[no-any-return]
    raise AssertionError("no sizes event")


def test_the_stream_sends_the_current_sizes(api: httpx.Client, ui: httpx.Client) -> None:
    publish(api, "live")
    publish(api, "live", delay=60)
    publish(api, "other")
    got = first_event(ui, "/events", ns=NS, q="live")
    (row,) = got["queues"]
    assert (row["ns"], row["q"], row["ready"], row["delayed"], row["reserved"], row["dead"]) == (
        NS,
        "live",
        1,
        1,
        0,
        0,
    )
    got = first_event(ui, "/events", ns=NS)
    assert {r["q"]: r["ready"] for r in got["queues"]} == {"live": 1, "other": 1}
    assert ui.get("/events", params={"ns": "bad!"}).status_code == 400
    assert ui.get("/events", params={"q": "live"}).status_code == 400  # q needs its ns
    head = ui.head("/events", params={"ns": NS})  # answered whole: the connection goes on
    assert head.status_code == 200 and head.headers["content-type"].startswith("text/event-stream")
    assert ui.get("/").status_code == 200


def test_the_stream_reports_rates_from_the_counters(api: httpx.Client, ui: httpx.Client) -> None:
    assert ui.get(f"/queue/{NS}/rated").status_code == 200  # a sample of the counters
    for _ in range(4):
        publish(api, "rated")
    consume(api, "rated")
    time.sleep(0.6)  # rates are differences between samples at least 0.5 s apart
    (row,) = first_event(ui, "/events", ns=NS, q="rated")["queues"]
    assert row["published_rate"] > 0 and row["delivered_rate"] > 0
    assert row["published_rate"] > row["delivered_rate"]  # 4 published, 1 delivered
    assert row["acked_rate"] == 0


def test_without_accounts_the_dashboard_is_open_and_logs_changes_as_anonymous(
    redis_server: Server, standalone_redis: redis.Redis, tmp_path: Path
) -> None:
    svc = ServiceProcess.start(
        f"127.0.0.1:{redis_server.port}",
        env={"CLUSTER_DQ_LOGLEVEL": "warning"},
        log=tmp_path / "service.log",
        inherit_settings=False,
        timeout=20,
    )
    try:
        with httpx.Client(base_url=f"{svc.admin}/ui", follow_redirects=True) as ui:
            assert ui.get("/").status_code == 200
            r = post(ui, f"/queue/{NS}/open/publish", body="x")
            assert "published" in flash(r)
            (entry,) = audit_rows(ui)
            assert (entry["user"], entry["action"]) == ("anonymous", "job.publish")
    finally:
        svc.stop(timeout=20)
    lines = [json.loads(x) for x in svc.logs().splitlines() if x.startswith("{")]
    (logged,) = [x for x in lines if x["logger"] == "cluster_dq.audit" and "action" in x]
    assert (logged["user"], logged["action"], logged["outcome"]) == (
        "anonymous",
        "job.publish",
        "ok",
    )
    assert logged["target"] == entry["target"]


def test_a_change_whose_outcome_redis_left_unknown_is_audited_as_unknown(tmp_path: Path) -> None:
    """Redis gone under an action: a 503 page (never a 500), and the audit log line says the
    outcome is unknown (the Redis copy cannot be written then; the log line is)."""
    own = start_server(free_port(22000, 23000))  # killed by this test
    svc = ServiceProcess.start(
        f"127.0.0.1:{own.port}",
        env={"CLUSTER_DQ_LOGLEVEL": "warning"},
        log=tmp_path / "service.log",
        inherit_settings=False,
        timeout=20,
        session=True,  # killed whole: a graceful stop without Redis is not this test's subject
    )
    try:
        with httpx.Client(base_url=f"{svc.admin}/ui", follow_redirects=True, timeout=60) as ui:
            assert ui.get(f"/queue/{NS}/gone").status_code == 200
            own.kill(signal.SIGKILL)
            r = post(ui, f"/queue/{NS}/gone/pause")
            assert r.status_code == 503 and "unavailable" in error_message(r)
    finally:
        svc.kill()
        own.kill()
    lines = [json.loads(x) for x in svc.logs().splitlines() if x.startswith("{")]
    (logged,) = [x for x in lines if x["logger"] == "cluster_dq.audit" and "action" in x]
    assert (logged["action"], logged["target"]) == ("queue.pause", f"{NS}/gone")
    assert logged["outcome"].startswith("unknown: ")


def test_an_open_stream_does_not_hold_up_a_graceful_stop(redis_server: Server) -> None:
    """The worker ends its streams when it begins to stop: with a stream open, SIGTERM still
    ends the service cleanly (exit 0) long before its grace period would cut the stream."""
    svc = serve(f"127.0.0.1:{redis_server.port}", CLUSTER_DQ_SHUTDOWNGRACESECOND="60")
    got: list[str] = []
    opened = threading.Event()

    def listen() -> None:
        with httpx.Client(auth=ADMIN_AUTH, timeout=90) as c:
            with c.stream("GET", f"{svc.admin}/ui/events") as r:
                for line in r.iter_lines():
                    got.append(line)
                    if line.startswith("event: sizes"):
                        opened.set()

    reader = threading.Thread(target=listen, daemon=True)
    reader.start()
    try:
        assert opened.wait(20), got
    finally:
        code = svc.stop(timeout=30)  # past 30 s: SIGKILL, and a non-zero status
    reader.join(10)
    assert code == 0
    assert "event: bye" in got and not reader.is_alive()


# -- the service methods the dashboard added ----------------------------------------------------


@pytest.fixture
async def svc_layer(deployment: Deployment, sync_redis: redis.Redis) -> AsyncIterator[Service]:
    ps = deployment.pool_settings()
    pool = RedisPool.create(ps, EngineConfig())
    await pool.start(run_pump=False)
    yield Service(Settings(Pool={"default": ps}), {"default": pool})
    await pool.close()


async def test_heads_list_ready_in_delivery_order_and_delayed_by_due_time(
    svc_layer: Service,
) -> None:
    route = svc_layer.route("default")
    specs = [
        JobSpec(b"a"),
        JobSpec(b"b", priority=9),
        JobSpec(b"c"),
        JobSpec(b"d", delay_ms=3_600_000),  # far: a wheel bucket
        JobSpec(b"e", delay_ms=5_000),  # near
        JobSpec(b"f", delay_ms=7_200_000),
    ]
    ids = [(await svc_layer.publish(route, "h", "q", [s]))[0].job_id for s in specs]
    ready = await svc_layer.heads(route, "h", "q", JobState.READY, 10)
    assert [j.job_id for j in ready] == [ids[1], ids[0], ids[2]]  # priority first
    delayed = await svc_layer.heads(route, "h", "q", JobState.DELAYED, 10)
    assert [j.job_id for j in delayed] == [ids[4], ids[3], ids[5]]
    assert [j.body for j in delayed] == [b"e", b"d", b"f"]
    assert [j.job_id for j in await svc_layer.heads(route, "h", "q", JobState.DELAYED, 1)] == [
        ids[4]
    ]
    assert await svc_layer.heads(route, "h", "empty", JobState.READY, 10) == []


async def test_the_audit_log_is_capped_and_newest_first(svc_layer: Service) -> None:
    for i in range(7):
        await svc_layer.record_audit("default", json.dumps({"n": i}), 5)
    got = [json.loads(e)["n"] for e in await svc_layer.audit_log(10)]
    assert got == [6, 5, 4, 3, 2]
    assert [json.loads(e)["n"] for e in await svc_layer.audit_log(2)] == [6, 5]


def test_the_workers_page_shows_who_is_running_what(api: httpx.Client, ui: httpx.Client) -> None:
    """Each announced worker with its queues and concurrency, the jobs it holds linked to their
    pages; ``q`` narrows to the workers holding that queue's jobs; the queue page's reserved
    count links there; a bad name is a 400 page."""
    jid = api.put(f"/api/{NS}/orders", content=b"x").json()["job_id"]
    held = [
        {"queue": "orders", "job_id": jid, "started_ms": int(time.time() * 1000) - 2_000},
        {"queue": "emails", "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM"},
    ]
    info = {"host": "web-3", "pid": 4242, "queues": ["orders", "emails"], "concurrency": 8}
    assert api.put(f"/api/{NS}/_workers/w-1", json={**info, "in_flight": held}).status_code == 200
    assert api.put(f"/api/{NS}/_workers/w-2", json={"queues": ["emails"]}).status_code == 200
    page = ui.get("/workers", params={"ns": NS})
    assert page.status_code == 200
    assert '<tr data-worker="w-1">' in page.text and '<tr data-worker="w-2">' in page.text
    assert "<td>web-3</td><td>4242</td>" in page.text and "2 / 8" in page.text
    assert f'href="/ui/job/{NS}/orders/{jid}"' in page.text
    assert re.search(r"for 2\.\d s \(since <time", page.text), page.text
    narrowed = ui.get("/workers", params={"ns": NS, "q": "orders"}).text
    assert '<tr data-worker="w-1">' in narrowed and 'data-worker="w-2"' not in narrowed
    assert "01M84CYQJ90007ZG2JKZ9W9AQM" not in narrowed  # (the emails job is not this queue's)
    none = ui.get("/workers", params={"ns": NS, "q": "nothing"}).text
    assert 'id="no-workers"' in none and "holds a job of nothing" in none
    queue_page = ui.get(f"/queue/{NS}/orders").text
    assert f'href="/ui/workers?ns={NS}&amp;q=orders"' in queue_page
    assert ui.get("/workers", params={"ns": "bad name"}).status_code == 400
    assert ui.get("/workers").status_code == 200  # the form alone
