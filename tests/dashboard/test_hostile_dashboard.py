# ruff: noqa: F811  (the fixtures are imported from test_dashboard and used as arguments)
"""Hostile and careless requests against the dashboard of a real `cluster-dq serve`: huge and
malformed inputs are a clear 4xx page that changes nothing (never a 500), no path escapes the
basic auth, and what users typed comes back escaped."""

from __future__ import annotations

import base64
import json
import re
import socket
import time

import httpx
import pytest

from tests.support.dashboard import NS, error_message, post, publish, sizes
from cluster_dq.dashboard.base import SSE_MAX_STREAMS
from cluster_dq.http.params import MAX_LIST
from tests.support import ADMIN_AUTH
from cluster_dq.testing.service_process import ServiceProcess

EMPTY = {"size": 0, "delayed": 0, "reserved": 0, "dead": 0}


@pytest.mark.parametrize(
    ("path", "form"),
    [
        ("/queue/shop/q/publish", {"delay": "-1"}),
        ("/queue/shop/q/publish", {"delay": "NaN"}),
        ("/queue/shop/q/publish", {"delay": "1e309"}),
        ("/queue/shop/q/publish", {"delay": "\u0661\u0662"}),
        ("/queue/shop/q/publish", {"tries": "9" * 40}),
        ("/queue/shop/q/publish", {"ttl": "1", "delay": "5"}),
        ("/deadletter/shop/q/purge", {"from": "0001-01-01T00:00:00+14:00"}),
        ("/deadletter/shop/q/redrive", {"from": "\u0661\u0662\u0663"}),
        ("/deadletter/shop/q/redrive", {"tries": "-1"}),
        ("/queue/shop/q/settings", {"ttr": "0"}),
        ("/queue/shop/q/settings", {"max_size": "1e3"}),
        ("/tokens/shop/limit", {"token": "<b>", "read": "1"}),
        ("/tokens/shop/create", {"description": "d", "token": "<script>x</script>"}),
    ],
)
def test_bad_numbers_and_dates_are_a_4xx_page(
    api: httpx.Client, ui: httpx.Client, path: str, form: dict[str, str]
) -> None:
    r = post(ui, path, body="x", **form)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    assert error_message(r)
    assert sizes(api, "q") == EMPTY


def test_a_huge_publish_form_is_refused_and_publishes_nothing(
    api: httpx.Client, ui: httpx.Client
) -> None:
    r = post(ui, "/queue/shop/q/publish", body="x" * (10 * 1024 * 1024))
    assert 400 <= r.status_code < 500, r.status_code
    assert sizes(api, "q") == EMPTY
    files = {"body": ("b", b"x" * (10 * 1024 * 1024))}
    r = ui.post("/queue/shop/q/publish", data={"csrf": ui.cookies["dq_csrf"]}, files=files)
    assert 400 <= r.status_code < 500, r.status_code
    assert sizes(api, "q") == EMPTY


def test_bad_query_parameters_are_a_4xx_page(api: httpx.Client, ui: httpx.Client) -> None:
    for path in (
        "/deadletter/shop/q?cursor=%00%ff<x>",
        "/deadletter/shop/q?cursor=" + "a" * 5000,
        "/events?ns=<x>",
        "/events?q=q",
        "/job/shop/q/" + "A" * 3000,
        "/queue/shop/" + "q" * 400,
        "/tokens?ns=%00",
    ):
        r = ui.get(path)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:300])


def test_no_path_escapes_the_basic_auth(service: ServiceProcess) -> None:
    for path in (
        "/UI/",
        "//ui/",
        "/ui/../ui/",
        "/ui/%2e%2e/ui/audit",
        "/ui/static/../templates/base.html",
        "/ui/static/%2e%2e/templates/base.html",
        "/ui%2faudit",
        "/ui/static/..%2ftemplates/base.html",
    ):
        r = httpx.get(f"{service.admin}{path}")
        # 400: an encoded '/' or '.' is refused before any routing (http/paths.py)
        assert r.status_code in (400, 401, 404), (path, r.status_code)
        assert "{%" not in r.text and "csrf" not in r.text
    for path in ("/ui/static/../templates/base.html", "/ui/static/%2e%2e/templates/base.html"):
        r = httpx.get(f"{service.admin}{path}", auth=ADMIN_AUTH)
        assert "{%" not in r.text, path


def test_a_forged_flash_cookie_is_escaped(ui: httpx.Client) -> None:
    blob = base64.urlsafe_b64encode(json.dumps(["error", "<script>alert(1)</script>"]).encode())
    ui.cookies.set("dq_flash", blob.decode(), path="/ui")
    r = ui.get("/audit")
    assert r.status_code == 200 and "<script>alert(1)" not in r.text
    ui.cookies.set("dq_flash", "!!!not base64", path="/ui")
    r = ui.get("/audit")
    assert r.status_code == 200


def test_a_job_with_markup_everywhere_is_shown_escaped(api: httpx.Client, ui: httpx.Client) -> None:
    evil = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
    jid = publish(api, "q", body=evil.encode())
    r = ui.get(f"/job/{NS}/q/{jid}")
    assert r.status_code == 200 and "<script>alert" not in r.text and "<img src=x" not in r.text
    r = post(ui, f"/job/{NS}/q/{jid}/bury", state="ready", reason=evil)
    assert r.status_code == 200
    for page in (f"/job/{NS}/q/{jid}", f"/deadletter/{NS}/q", "/audit", f"/queue/{NS}/q"):
        r = ui.get(page)
        assert "<script>alert" not in r.text and "<img src=x" not in r.text, page


def test_a_form_declaring_a_huge_length_is_refused_before_it_is_read(
    service: ServiceProcess, ui: httpx.Client
) -> None:
    """A form over the limit is refused from its Content-Length (413 at once), not read into
    memory first (the server would wait for 10 GB here)."""
    url = httpx.URL(service.admin)
    cookie = f"dq_csrf={ui.cookies['dq_csrf']}"
    auth = base64.b64encode(f"{ADMIN_AUTH[0]}:{ADMIN_AUTH[1]}".encode()).decode()
    with socket.create_connection((url.host, url.port), timeout=3) as s:
        s.sendall(
            (
                f"POST /ui/queue/{NS}/q/publish HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
                f"Authorization: Basic {auth}\r\nCookie: {cookie}\r\n"
                "Content-Type: application/x-www-form-urlencoded\r\n"
                f"Content-Length: {10**10}\r\n\r\nbody=xxxx"
            ).encode()
        )
        try:
            head = s.recv(4096)
        except TimeoutError:
            head = b"(no reply within 3 s)"
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


def test_live_streams_are_bounded_and_a_closed_one_frees_its_place(
    service: ServiceProcess, ui: httpx.Client
) -> None:
    url = httpx.URL(service.admin)
    auth = base64.b64encode(f"{ADMIN_AUTH[0]}:{ADMIN_AUTH[1]}".encode()).decode()
    request = (
        f"GET /ui/events HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        f"Authorization: Basic {auth}\r\n\r\n"
    ).encode()

    def open_stream() -> tuple[socket.socket, bytes]:
        s = socket.create_connection((url.host, url.port), timeout=5)
        s.sendall(request)
        return s, s.recv(200)

    opened: list[socket.socket] = []
    try:
        for _ in range(SSE_MAX_STREAMS):
            s, head = open_stream()
            opened.append(s)
            assert head.startswith(b"HTTP/1.1 200"), head
        s, head = open_stream()
        opened.append(s)
        assert head.startswith(b"HTTP/1.1 503"), head  # never-reading clients hold no more
        for s in opened[:5]:
            s.close()
        deadline = time.monotonic() + 5
        while True:  # the server notices the closed ones within a second
            s, head = open_stream()
            opened.append(s)
            if head.startswith(b"HTTP/1.1 200"):
                break
            assert time.monotonic() < deadline, head
            time.sleep(0.2)
    finally:
        for s in opened:
            s.close()


@pytest.mark.parametrize("planted", ["", "short", "x" * 3000], ids=["empty", "short", "long"])
def test_an_empty_or_malformed_csrf_cookie_is_replaced_not_a_lockout(
    service: ServiceProcess, api: httpx.Client, planted: str
) -> None:
    """A session whose token cookie is empty or malformed gets a fresh token with its next
    page (before: the page's forms carried a token the cookie never matched, every action a
    403 until the cookie was removed by hand)."""
    with httpx.Client(
        base_url=f"{service.admin}/ui", auth=ADMIN_AUTH, follow_redirects=True, timeout=30
    ) as browser:
        browser.cookies.set("dq_csrf", planted, path="/ui")
        page = browser.get(f"/queue/{NS}/q")
        assert page.status_code == 200
        (token,) = set(re.findall(r'name="csrf" value="([^"]*)"', page.text))
        assert token and token != planted
        r = browser.post(f"/queue/{NS}/q/publish", data={"csrf": token, "body": "x"})
        assert r.status_code == 200, error_message(r)
    assert sizes(api, "q")["size"] == 1


def test_forged_posts_are_refused_and_change_nothing(api: httpx.Client, ui: httpx.Client) -> None:
    token = ui.cookies["dq_csrf"]
    path = f"/queue/{NS}/q/publish"
    refused = [
        # a form posted as text/plain (what a cross-site form may send without a preflight)
        ui.post(path, content=f"csrf={token}&body=x", headers={"Content-Type": "text/plain"}),
        ui.post(path, data={"csrf": token, "body": "x"}, headers={"Origin": "null"}),
        ui.post(path, data={"csrf": token, "body": "x"}, headers={"Origin": "file://"}),
        ui.post(  # the right token, not from this host and port
            path, data={"csrf": token, "body": "x"}, headers={"Origin": "http://127.0.0.1:1"}
        ),
        ui.post(path, data={"csrf": token.upper(), "body": "x"}),
        ui.post(path, data={"csrf": token[:-1], "body": "x"}),
        ui.get(path, params={"csrf": token, "body": "x"}),  # no action through GET
        ui.request("PUT", path, data={"csrf": token, "body": "x"}),
        ui.post(path + "?_method=GET", data={"csrf": "x", "body": "x"}),
    ]
    assert [r.status_code for r in refused] == [403] * 6 + [405] * 2 + [403]
    assert sizes(api, "q") == EMPTY


def test_the_overview_says_when_a_namespace_has_more_queues_than_it_lists(
    api: httpx.Client, ui: httpx.Client
) -> None:
    """(Before: the first 1,000 queues were listed and nothing said there were more.)"""
    with httpx.Client(base_url=api.base_url, headers=api.headers, timeout=30) as c:
        for i in range(MAX_LIST + 1):
            assert c.put(f"/api/{NS}/q{i:05d}", content=b"x").status_code == 201
    r = ui.get("/", params={"ns": NS})
    assert r.status_code == 200
    assert r.text.count("data-queue-link=") == MAX_LIST
    assert f"first {MAX_LIST} queues" in r.text
    r = ui.get("/")
    assert f"first {MAX_LIST} queues" in r.text
