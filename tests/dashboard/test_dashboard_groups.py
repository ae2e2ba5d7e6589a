"""The queue page's Groups panel through real HTTP against a `cluster-dq serve` process on the
test's topology: a row per group holding jobs with its sizes and settings (nothing at all when
no group holds jobs), the later pages, a group paused and resumed, its concurrency and rate
limits set and removed, each change audited; bad values refused naming the field, forged and
read-only posts refused, and none of them changing anything; the job page's group."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx

from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH, Deployment, serve
from tests.support.dashboard import (
    NS,
    audit_rows,
    csrf,
    error_message,
    flash,
    post,
    publish,
)

CELLS = ("size", "reserved", "held", "paused", "concurrency", "rate")


def rows(text: str) -> dict[str, dict[str, str]]:
    """The groups a panel (or page) shows: name -> each cell's text."""
    out = {}
    for found in re.finditer(r'<tr class="group" data-group="([^"]+)".*?</tr>', text, re.S):
        name, row = found.group(1), found.group(0)
        cells = {}
        for cell in CELLS:
            shown = re.search(rf"data-group-{cell}>(.*?)</td>", row, re.S)
            assert shown is not None, (cell, row)
            cells[cell] = html.unescape(re.sub(r"<[^>]+>", "", shown.group(1))).strip()
        out[name] = cells
    return out


def panel(ui: httpx.Client, q: str, **query: str) -> httpx.Response:
    r = ui.get(f"/panels/groups/{NS}/{q}", params=query)
    assert r.status_code == 200, r.text
    return r


def group(api: httpx.Client, q: str, g: str) -> dict[str, Any]:
    r = api.get(f"/api/{NS}/{q}/groups/{g}")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def take(api: httpx.Client, q: str, n: int = 10) -> list[dict[str, Any]]:
    """What a worker asking for ``n`` jobs is given (none: [])."""
    r = api.get(f"/api/{NS}/{q}", params={"ttr": 60, "count": n})
    if r.status_code == 404:
        return []
    assert r.status_code == 200, r.text
    body = r.json()
    return body if isinstance(body, list) else body.get("jobs", [body])  # type: ignore[no-any-return]


def acts(ui: httpx.Client) -> list[tuple[str, str, str]]:
    return [(e["action"], e["target"], e["outcome"]) for e in audit_rows(ui)]


# -- the panel ----------------------------------------------------------------------------------


def test_the_panel_shows_each_group_holding_jobs_and_nothing_without_groups(
    api: httpx.Client, ui: httpx.Client
) -> None:
    q = "tenants"
    assert "group-panel" not in panel(ui, q).text  # no queue at all
    publish(api, q)
    assert "group-panel" not in panel(ui, q).text  # jobs, none of them in a group
    page = ui.get(f"/queue/{NS}/{q}").text
    assert f'data-panel-src="/ui/panels/groups/{NS}/{q}"' in page  # the page loads the panel

    for g in ("acme", "acme", "acme", "beta", "beta"):
        publish(api, q, group=g)
    publish(api, q, group="later", delay=600)
    r = api.patch(f"/api/{NS}/{q}/groups/acme", json={"concurrency": 1, "rate": "100/1s"})
    assert r.status_code == 200, r.text
    got = take(api, q)
    assert sorted(j.get("group") or "" for j in got) == ["", "acme", "beta", "beta"]
    shown = rows(panel(ui, q).text)
    assert shown == {
        "acme": {
            "size": "3",
            "reserved": "1",
            "held": "2",  # ready, held back by its concurrency limit
            "paused": "no",
            "concurrency": "1",
            "rate": "100/1000ms",
        },
        "beta": {
            "size": "2",
            "reserved": "2",
            "held": "0",
            "paused": "no",
            "concurrency": "—",
            "rate": "—",
        },
        "later": {
            "size": "1",
            "reserved": "0",
            "held": "0",
            "paused": "no",
            "concurrency": "—",
            "rate": "—",
        },
    }
    assert list(shown) == sorted(shown)  # by name
    text = panel(ui, q).text
    assert 'id="groups-more"' not in text and 'id="groups-first"' not in text
    assert 'class="group-pause"' in text and 'class="group-limits"' in text
    assert ui.get(f"/panels/groups/{NS}/{q}", params={"pool": "no-such"}).status_code == 404


def test_the_panel_pages_through_many_groups(api: httpx.Client, ui: httpx.Client) -> None:
    """A page shows about 100 groups; its "more" link leads to the next, until every group
    holding jobs was shown."""
    q = "many"
    names = {f"t{i:03d}" for i in range(400)}
    for g in sorted(names):
        publish(api, q, group=g)
    text = panel(ui, q).text
    seen = list(rows(text))
    assert 100 <= len(seen) < 400
    pages = 1
    while (more := re.search(r'id="groups-more" href="([^"]+)"', text)) is not None:
        r = ui.get(html.unescape(more.group(1)).removeprefix("/ui"))
        assert r.status_code == 200 and 'id="groups-first"' in r.text
        assert 'data-panel-src="/ui/panels/groups/' in r.text  # refreshed as the panel is
        text = r.text
        seen += rows(text)
        pages += 1
        assert pages < 20
    assert pages >= 2 and set(seen) == names
    assert ui.get(f"/queue/{NS}/{q}/groups", params={"cursor": "x1"}).status_code == 400


# -- actions ------------------------------------------------------------------------------------


def test_a_group_paused_and_resumed(api: httpx.Client, ui: httpx.Client) -> None:
    q = "pausing"
    for g in ("acme", "acme", "beta"):
        publish(api, q, group=g)
    r = post(ui, f"/queue/{NS}/{q}/groups/acme/pause", cursor="0")
    assert r.status_code == 200 and r.url.path == f"/ui/queue/{NS}/{q}"
    assert (
        flash(r) == f"group acme of {NS}/{q} paused: its jobs are held back, the other groups go on"
    )
    assert 'data-level="ok"' in r.text
    assert group(api, q, "acme")["paused"] is True
    assert [j["group"] for j in take(api, q)] == ["beta"]  # the others go on
    shown = rows(panel(ui, q).text)
    assert (shown["acme"]["paused"], shown["acme"]["held"]) == ("paused", "2")
    assert 'action="/ui/queue/shop/pausing/groups/acme/resume"' in panel(ui, q).text

    r = post(ui, f"/queue/{NS}/{q}/groups/acme/resume", cursor="0")
    assert flash(r) == f"group acme of {NS}/{q} resumed"
    got = group(api, q, "acme")
    assert (got["paused"], got["held"]) == (False, 0)
    assert [j["group"] for j in take(api, q)] == ["acme", "acme"]
    assert acts(ui) == [
        ("group.resume", f"{NS}/{q}/acme", "ok"),
        ("group.pause", f"{NS}/{q}/acme", "ok"),
    ]


def test_limits_set_and_removed(api: httpx.Client, ui: httpx.Client) -> None:
    q = "limits"
    publish(api, q, group="acme")
    path = f"/queue/{NS}/{q}/groups/acme/limits"
    shown = {"shown_concurrency": "", "shown_rate": ""}

    r = post(ui, path, concurrency="5", rate="", **shown)
    assert flash(r) == "group acme: concurrency limit 5, rate limit none"
    assert (group(api, q, "acme")["concurrency"], group(api, q, "acme")["rate"]) == (5, None)
    assert rows(panel(ui, q).text)["acme"]["concurrency"] == "5"

    shown = {"shown_concurrency": "5", "shown_rate": ""}
    r = post(ui, path, concurrency="5", rate="10/1s", **shown)
    assert flash(r) == "group acme: concurrency limit 5, rate limit 10/1000ms"
    assert (group(api, q, "acme")["concurrency"], group(api, q, "acme")["rate"]) == (5, "10/1000ms")
    text = panel(ui, q).text
    assert 'name="rate" value="10/1000ms"' in text and 'name="shown_rate" value="10/1000ms"' in text

    # what the page showed is left alone: saving the same form changes nothing, audits nothing
    shown = {"shown_concurrency": "5", "shown_rate": "10/1000ms"}
    r = post(ui, path, concurrency="5", rate="10/1000ms", **shown)
    assert flash(r) == "group acme: nothing changed" and 'data-level="info"' in r.text
    assert len(acts(ui)) == 2

    r = post(ui, path, concurrency="", rate="10/1000ms", **shown)  # an empty field removes it
    assert flash(r) == "group acme: concurrency limit none, rate limit 10/1000ms"
    r = post(ui, path, rate="")  # a field not sent is left alone
    assert flash(r) == "group acme: concurrency limit none, rate limit none"
    got = group(api, q, "acme")
    assert (got["concurrency"], got["rate"]) == (None, None)
    r = post(ui, path, concurrency="3")
    assert (group(api, q, "acme")["concurrency"], group(api, q, "acme")["rate"]) == (3, None)
    assert [a[0] for a in acts(ui)] == ["group.limits"] * 5
    assert acts(ui)[-1] == (
        "group.limits",
        f"{NS}/{q}/acme",
        'ok: {"concurrency": 5, "rate": null}',
    )


def test_bad_values_are_refused_naming_the_field_and_change_nothing(
    api: httpx.Client, ui: httpx.Client
) -> None:
    q = "bad"
    publish(api, q, group="acme")
    api.patch(f"/api/{NS}/{q}/groups/acme", json={"concurrency": 2, "rate": "5/1s"})
    before = group(api, q, "acme")
    path = f"/queue/{NS}/{q}/groups/acme/limits"
    for form, field in [
        ({"rate": "fast"}, "rate"),
        ({"rate": "0/1s"}, "rate"),
        ({"rate": "10/2d"}, "rate"),
        ({"rate": "10/48h"}, "rate"),
        ({"concurrency": "1", "rate": "10 per s"}, "rate"),  # one bad field: neither changes
        ({"concurrency": "0"}, "concurrency"),
        ({"concurrency": "-1"}, "concurrency"),
        ({"concurrency": "two"}, "concurrency"),
        ({"concurrency": "9" * 40}, "concurrency"),
        ({"concurrency": "5", "rate": "1/1s", "cursor": "x"}, "cursor"),
        ({}, "nothing to change"),
    ]:
        r = post(ui, path, **form)
        assert r.status_code == 400, (form, r.status_code)
        assert field in error_message(r), (form, error_message(r))
    for bad in ("a b", "x" * 65, "<b>"):
        r = post(ui, f"/queue/{NS}/{q}/groups/{bad}/pause")
        assert r.status_code in (400, 404), (bad, r.status_code)
        assert "<b>" not in r.text
    assert group(api, q, "acme") == before
    assert acts(ui) == []


def test_a_forged_post_is_refused_and_changes_nothing(api: httpx.Client, ui: httpx.Client) -> None:
    q = "forged"
    publish(api, q, group="acme")
    refused = []
    for path, form in [
        (f"/queue/{NS}/{q}/groups/acme/pause", {}),
        (f"/queue/{NS}/{q}/groups/acme/limits", {"concurrency": "1", "rate": "1/1h"}),
    ]:
        refused += [
            ui.post(path, data=form),  # no token
            ui.post(path, data={**form, "csrf": "x" * 43}),  # a wrong one
            ui.post(  # the right one, from another site
                path, data={**form, "csrf": csrf(ui)}, headers={"Origin": "https://evil.example"}
            ),
        ]
        with httpx.Client(auth=ADMIN_AUTH) as stranger:  # the right form token, no cookie
            url = str(ui.base_url).rstrip("/") + path
            refused.append(stranger.post(url, data={**form, "csrf": csrf(ui)}))
    assert [r.status_code for r in refused] == [403] * 8
    assert "CSRF" in error_message(refused[0]) and "cross-origin" in error_message(refused[2])
    got = group(api, q, "acme")
    assert (got["paused"], got["concurrency"], got["rate"]) == (False, None, None)
    assert acts(ui) == []


def test_read_only_shows_the_groups_without_actions_and_refuses_them(
    api: httpx.Client, deployment: Deployment
) -> None:
    q = "ro"
    publish(api, q, group="acme")
    svc: ServiceProcess = serve(deployment.pool_settings(), CLUSTER_DQ_ADMINREADONLY="true")
    try:
        with httpx.Client(
            base_url=f"{svc.admin}/ui", auth=ADMIN_AUTH, follow_redirects=True, timeout=30
        ) as ro:
            text = panel(ro, q).text
            assert rows(text)["acme"]["size"] == "1" and "<form" not in text
            token = ro.cookies["dq_csrf"]
            for verb, form in [("pause", {}), ("limits", {"concurrency": "1"})]:
                r = ro.post(f"/queue/{NS}/{q}/groups/acme/{verb}", data={"csrf": token, **form})
                assert r.status_code == 403 and "read-only" in error_message(r)
    finally:
        svc.stop(timeout=20)
    got = group(api, q, "acme")
    assert (got["paused"], got["concurrency"]) == (False, None)


# -- the job page -------------------------------------------------------------------------------


def test_the_job_page_shows_the_jobs_group(api: httpx.Client, ui: httpx.Client) -> None:
    q = "jobs"
    grouped = publish(api, q, group="tenant-7")
    plain = publish(api, q)
    page = ui.get(f"/job/{NS}/{q}/{grouped}").text
    found = re.search(r'id="job-group"><a href="([^"]+)"[^>]*>([^<]+)</a>', page)
    assert found is not None, page
    assert found.groups() == (f"/ui/queue/{NS}/{q}#groups", "tenant-7")
    assert 'id="job-group"' not in ui.get(f"/job/{NS}/{q}/{plain}").text
    assert 'id="groups"' in ui.get(f"/queue/{NS}/{q}").text  # where the link leads
