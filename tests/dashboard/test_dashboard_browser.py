"""The dashboard in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by Selenium) against a real ``cluster-dq serve`` on a real redis-server: a job's life
clicked through (publish, bury, the dead letters and the job's fingerprint group, the group
redriven, consumed by a worker over the data API, acked from the page), a race with the page,
pause and resume, live numbers without a reload, the charts following a redelivery, the
delay timeline (a delayed job in its bin, the bin rescheduled), a queue's last 24 hours
and its in-flight list (the worker holding a job, clicked through to the workers page), and
its groups (one paused and resumed, its numbers following, its limits set; a job's group
clicked through from the job page). One topology (standalone) is
enough here: the pages' data is covered on all three by the httpx tests of
``tests/dashboard/test_dashboard_panels.py`` and the dashboard's own suite.

A PNG screenshot of each step goes to ``build/screenshots/`` at the repository's root
(``gwN/`` under it for test worker N), named by step; the paths are printed (``-s`` shows
them)."""

from __future__ import annotations

import base64
import re
import os
import shutil
import time
from datetime import datetime, timezone
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from cluster_dq.localredis import Server
from cluster_dq.models import id_due_ms_of_text
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH, serve

from tests.support import ROOT

# one directory per test worker: two workers must not clear or number each other's shots
SHOTS = ROOT / "build" / "screenshots" / os.environ.get("PYTEST_XDIST_WORKER", "")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
NS, Q = "shop", "orders"
WAIT_S = 10


@pytest.fixture(scope="module")
def own_service(redis_server: Server) -> Iterator[ServiceProcess]:
    redis_server.client().flushall()  # before the service's pump takes its leases
    svc = serve(redis_server.pool_settings(), CLUSTER_DQ_HISTORYFLUSHSECOND="1")  # the 24-h charts
    yield svc
    svc.stop(timeout=20)


@pytest.fixture(scope="module")
def api(own_service: ServiceProcess) -> Iterator[httpx.Client]:
    """The data API as a worker sees it, with a token of ``NS``."""
    token = httpx.post(
        f"{own_service.admin}/token/{NS}", params={"description": "browser"}, auth=ADMIN_AUTH
    ).json()["token"]
    with httpx.Client(base_url=own_service.base, headers={"X-Token": token}, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """Headless Chromium; the admin account goes in every request's Authorization header."""
    for path in (CHROMIUM, CHROMEDRIVER):
        assert Path(path).exists(), f"{path} missing: run deploy/dev/test (it installs it)"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1000")
    driver = webdriver.Chrome(options=options, service=DriverService(CHROMEDRIVER))
    try:
        basic = base64.b64encode(":".join(ADMIN_AUTH).encode()).decode()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {basic}"}}
        )
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shot() -> Callable[[WebDriver, str], Path]:
    if SHOTS.exists():
        shutil.rmtree(SHOTS)
    SHOTS.mkdir(parents=True)
    count = [0]

    def take(driver: WebDriver, step: str) -> Path:
        count[0] += 1
        path = SHOTS / f"{count[0]:02d}-{step}.png"
        assert driver.save_screenshot(str(path)), path
        print(f"screenshot: {path}")
        return path

    return take


class Page:
    """The dashboard as the test clicks through it."""

    def __init__(self, driver: WebDriver, admin: str) -> None:
        self.d = driver
        self.admin = admin

    def open(self, path: str) -> None:
        self.d.get(f"{self.admin}/ui{path}")

    def find(self, css: str) -> WebElement:
        return self.d.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.d.find_elements(By.CSS_SELECTOR, css)

    def wait(self, until: Callable[[], Any], what: str) -> Any:
        # (a page's fragments are replaced as they refresh: an element found a moment ago may
        # be gone by the time it is read, so the look is made again)
        return WebDriverWait(
            self.d, WAIT_S, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
        ).until(lambda _: until(), message=what)

    def submit(self, form_css: str, **fields: str) -> None:
        def fill_and_send() -> bool:
            form = self.find(form_css)
            for name, value in fields.items():
                box = form.find_element(By.NAME, name)
                box.clear()
                box.send_keys(value)
            form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
            return True

        # a form in a fragment may be replaced before it is filled in: it is looked up again
        self.wait(fill_and_send, f"the form {form_css} sent")

    def click(self, css: str) -> None:
        """Clicks what ``css`` finds (looked up again if a fragment replaced it meanwhile)."""
        self.wait(lambda: self.find(css).click() or True, f"a click on {css}")

    def flash(self) -> str:
        return str(self.wait(lambda: self.all("#flash") and self.find("#flash").text, "a flash"))


def test_a_job_clicked_through_its_life(
    own_service: ServiceProcess, api: httpx.Client, browser: WebDriver, shot: Any
) -> None:
    page = Page(browser, own_service.admin)
    page.open(f"/queue/{NS}/{Q}")
    shot(browser, "queue-empty")

    # publish from the queue page: in the ready head, and on its own page
    page.submit("#publish-form", body="close order 42")
    message = page.flash()
    (jid,) = re.findall(r"published job (\S+)", message)
    assert page.all(f'#ready-head li[data-job-id="{jid}"]'), "not in the ready head"
    shot(browser, "published")
    page.find(f'#ready-head li[data-job-id="{jid}"] a').click()
    assert page.find("#job-state").get_attribute("data-state") == "ready"
    assert page.find("#job-body").text == "close order 42"
    shot(browser, "job-ready")

    # bury with a reason: in the dead letters with it, and in its fingerprint group
    page.submit("#action-bury", reason="order 42 failed: card 4242 expired")
    assert "buried" in page.flash()
    assert page.find("#job-state").get_attribute("data-state") == "dead"
    page.open(f"/deadletter/{NS}/{Q}")
    row = page.find(f'#dead-jobs tr[data-job-id="{jid}"]')
    assert row.get_attribute("data-reason") == "buried"
    assert "order 42 failed: card 4242 expired" in row.text
    group = page.wait(lambda: page.all("#dead-groups tr.dead-group"), "the fingerprint groups")[0]
    assert group.get_attribute("data-count") == "1"
    assert "order <n> failed: card <n> expired" in group.text
    shot(browser, "dead-letters-and-groups")

    # kick it back with its group's redrive, then a worker takes it over the data API
    group.find_element(By.CSS_SELECTOR, "form.group-redrive button").click()
    assert "kicked 1 job(s) of group" in page.flash()
    assert not page.all(f'#dead-jobs tr[data-job-id="{jid}"]')
    got = api.get(f"/api/{NS}/{Q}", params={"ttr": 60})
    assert got.status_code == 200 and got.json()["job_id"] == jid
    page.open(f"/job/{NS}/{Q}/{jid}")
    assert page.find("#job-state").get_attribute("data-state") == "reserved"
    shot(browser, "job-reserved-by-worker")

    # ack it from the dashboard: the job is gone
    page.find("#action-ack button").click()
    assert "acked" in page.flash()
    assert api.get(f"/api/{NS}/{Q}/job/{jid}").status_code == 404
    assert api.get(f"/api/{NS}/{Q}/size").json()["reserved"] == 0
    shot(browser, "acked-gone")


def test_a_race_with_the_page_is_told_in_the_flash(
    own_service: ServiceProcess, api: httpx.Client, browser: WebDriver, shot: Any
) -> None:
    page = Page(browser, own_service.admin)
    jid = api.put(f"/api/{NS}/{Q}", content=b"raced").json()["job_id"]
    page.open(f"/job/{NS}/{Q}/{jid}")
    assert page.find("#job-state").get_attribute("data-state") == "ready"
    # behind the page's back, a worker takes the job
    assert api.get(f"/api/{NS}/{Q}", params={"ttr": 60}).json()["job_id"] == jid
    page.submit("#action-reschedule", delay="30")
    message = page.flash()
    assert "was not rescheduled" in message and "reserved" in message
    assert page.find("#flash").get_attribute("data-level") == "warn"
    shot(browser, "race-flash")
    assert api.get(f"/api/{NS}/{Q}/job/{jid}").json()["state"] == "reserved"  # untouched
    api.delete(f"/api/{NS}/{Q}/job/{jid}")


def test_times_stay_utc_in_a_browser_of_another_zone(
    own_service: ServiceProcess, api: httpx.Client, browser: WebDriver, shot: Any
) -> None:
    """The page's script rewrote every time into the browser's zone, with no zone shown, while
    the purge form took UTC: in Tokyo a time copied from a page named another moment."""
    page = Page(browser, own_service.admin)
    jid = api.put(f"/api/{NS}/{Q}", params={"delay": 3600}, content=b"later").json()["job_id"]
    browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Tokyo"})
    try:
        assert browser.execute_script("return new Date(0).getTimezoneOffset()") == -540
        page.open(f"/job/{NS}/{Q}/{jid}")
        due = page.find("#job-due time")
        ms = int(due.get_attribute("data-ms") or 0)
        assert ms == id_due_ms_of_text(jid)
        at = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
        assert due.text == at.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d} UTC"
        shot(browser, "job-due-utc-in-tokyo")
    finally:
        browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ""})
    api.delete(f"/api/{NS}/{Q}/job/{jid}")


def test_pause_resume_and_live_numbers(
    own_service: ServiceProcess, api: httpx.Client, browser: WebDriver, shot: Any
) -> None:
    # a queue pauses once it exists (a typo's pause is a 404): one delayed job makes it known
    api.put(f"/api/{NS}/{Q}", params={"delay": 3600}, content=b"known")
    page = Page(browser, own_service.admin)
    page.open(f"/queue/{NS}/{Q}")
    page.find("#pause-form button").click()
    page.flash()
    assert page.all("#paused-badge")
    assert api.get(f"/api/{NS}/{Q}/settings").json()["paused"] is True
    shot(browser, "paused")
    page.find("#resume-form button").click()
    page.flash()
    assert not page.all("#paused-badge")
    assert api.get(f"/api/{NS}/{Q}/settings").json()["paused"] is False

    # the sizes follow the queue through the event stream, with no reload
    ready = page.find('#queue [data-size="ready"]')
    before = int(ready.text)
    page.d.execute_script("document.body.setAttribute('data-loaded-once', 'yes')")
    api.put(f"/api/{NS}/{Q}/bulk", content=b"[1, 2, 3]")
    page.wait(lambda: int(ready.text) == before + 3, "the ready size to follow")
    assert page.find("body").get_attribute("data-loaded-once") == "yes"  # same page
    shot(browser, "live-sizes")
    api.delete(f"/api/{NS}/{Q}")


def test_the_delay_timeline_and_a_bins_reschedule(
    own_service: ServiceProcess, api: httpx.Client, browser: WebDriver, shot: Any
) -> None:
    page = Page(browser, own_service.admin)
    jid = api.put(f"/api/{NS}/{Q}", params={"delay": 7200}, content=b"later").json()["job_id"]
    due = id_due_ms_of_text(jid) or 0
    page.open(f"/queue/{NS}/{Q}")
    page.wait(lambda: page.all("#charts"), "the charts fragment")
    page.find("#link-timeline").click()
    assert page.find("#timeline-total").text == "1"
    (row,) = page.all("#timeline-bins tr.bin")
    start, end = int(row.get_attribute("data-start") or 0), int(row.get_attribute("data-end") or 0)
    assert start <= due < end and row.get_attribute("data-count") == "1"
    shot(browser, "timeline")
    row.find_element(By.CSS_SELECTOR, "a.drill").click()
    assert [r.get_attribute("data-job-id") for r in page.all("#bucket-jobs tr[data-job-id]")] == [
        jid
    ]
    shot(browser, "timeline-bin")

    page.submit("#bucket-shift", shift="-3600")
    assert "rescheduled 1 job" in page.flash()
    (row,) = page.all("#timeline-bins tr.bin")
    start, end = int(row.get_attribute("data-start") or 0), int(row.get_attribute("data-end") or 0)
    assert start <= due - 3_600_000 < end  # the job moved an hour earlier
    row.find_element(By.CSS_SELECTOR, "a.drill").click()
    assert page.all(f'#bucket-jobs tr[data-job-id="{jid}"]')
    shot(browser, "timeline-rescheduled")

    page.find("#nav-topology").click()
    pool = page.find("#pool-default")
    assert pool.get_attribute("data-kind") == "standalone"
    holders = [r.get_attribute("data-holder") for r in page.all("tr.leader")]
    assert len(holders) == 16 and all(holders)
    shot(browser, "topology")
    api.delete(f"/api/{NS}/{Q}")


def test_the_charts_follow_deliveries_and_redeliveries(
    own_service: ServiceProcess, api: httpx.Client, browser: WebDriver, shot: Any
) -> None:
    """The queue page's charts: a first delivery, its ttr running out and a redelivery appear
    in the next sample (one every 5 s), with no reload."""
    page = Page(browser, own_service.admin)
    q = "charted"
    page.open(f"/queue/{NS}/{q}")
    page.wait(lambda: page.all("#charts"), "the charts fragment")
    jid = api.put(f"/api/{NS}/{q}", params={"tries": 2}, content=b"c").json()["job_id"]
    assert api.get(f"/api/{NS}/{q}", params={"ttr_ms": 100}).json()["job_id"] == jid
    again = api.get(f"/api/{NS}/{q}", params={"ttr": 60, "timeout": 5}).json()
    assert (again["job_id"], again["deliveries"]) == (jid, 2)

    def counts() -> list[str | None]:  # read in one go: the fragment is replaced every 5 s
        return browser.execute_script(  # type: ignore[no-any-return]
            "return ['#delivered', '#redelivered', '#ttr-expired'].map("
            "s => document.querySelector('#charts ' + s)?.textContent ?? null).concat(["
            "document.querySelector('#chart-redelivery polyline.l-redo')"
            "?.getAttribute('points') ? 'drawn' : null])"
        )

    WebDriverWait(browser, 15, poll_frequency=0.2).until(
        lambda _: counts() == ["2", "1", "1", "drawn"], "the next sample"
    )
    shot(browser, "charts")
    api.delete(f"/api/{NS}/{q}/job/{jid}")


def test_a_panel_that_fails_shows_the_reason_not_a_page_inside_the_page(
    own_service: ServiceProcess, browser: WebDriver, shot: Any
) -> None:
    """A fragment answered with an error page (here a 400: a bad queue name) was put into the
    panel whole, with its nav bar and scripts: a page inside the page. The panel now says
    why, as text, and keeps the page's own nav the only one."""
    page = Page(browser, own_service.admin)
    page.open(f"/queue/{NS}/{Q}")
    page.wait(lambda: page.all("#charts"), "the charts fragment")
    browser.execute_script(
        "var el = document.createElement('div'); el.id = 'broken-panel';"
        "el.dataset.panelSrc = '/ui/panels/deadgroups/" + NS + "/bad%20name';"
        "document.querySelector('main').appendChild(el);"
        "var s = document.createElement('script'); s.src = '/ui/static/panels.js?again';"
        "document.body.appendChild(s);"
    )
    page.wait(lambda: page.all("#broken-panel.panel-error"), "the panel marked failed")
    shot(browser, "broken-panel")
    broken = page.find("#broken-panel")
    assert len(page.all("#nav-overview")) == 1  # no second page (nav) inside the panel
    assert not broken.find_elements(By.CSS_SELECTOR, "nav, header, main, script, a")
    assert "queue name" in broken.text and len(broken.text) < 300


def test_the_workers_page_and_a_held_job_clicked_through(
    browser: WebDriver, own_service: ServiceProcess, api: httpx.Client, shot: Any
) -> None:
    """A worker holding a job: the queue page's reserved count leads to the workers holding
    its jobs, and the held job's link to its page."""
    jid = api.put(f"/api/{NS}/{Q}", content=b"held").json()["job_id"]
    got = api.get(f"/api/{NS}/{Q}", params={"ttr": 60, "timeout": 1})
    assert got.status_code == 200 and got.json()["job_id"] == jid
    held = [
        {
            "queue": Q,
            "job_id": jid,
            "started_ms": int(datetime.now(timezone.utc).timestamp() * 1000),
        }
    ]
    info = {"host": "web-3", "pid": 4242, "queues": [Q], "concurrency": 4, "in_flight": held}
    assert api.put(f"/api/{NS}/_workers/web-3-4242", json=info).status_code == 200
    page = Page(browser, own_service.admin)
    page.open(f"/queue/{NS}/{Q}")
    page.wait(lambda: page.find("#in-flight-link").text == "1", "one job reserved")
    page.find("#in-flight-link").click()
    page.wait(lambda: page.all('tr[data-worker="web-3-4242"]'), "the worker's row")
    assert page.find('tr[data-worker="web-3-4242"] [data-held]').text == "1 / 4"
    shot(browser, "workers")
    page.find(f'tr[data-job="{jid}"] a').click()
    page.wait(lambda: jid in browser.current_url, "the held job's page")
    assert "reserved" in page.find("body").text
    shot(browser, "held-job")
    api.delete(f"/api/{NS}/_workers/web-3-4242")
    api.delete(f"/api/{NS}/{Q}/job/{jid}")


def test_the_last_24_hours_and_the_jobs_in_flight_on_the_queue_page(
    browser: WebDriver, own_service: ServiceProcess, api: httpx.Client, shot: Any
) -> None:
    """Work on a queue shows in its 24-h charts once the service has flushed it (every second
    here), with UTC ticks; the job held by a worker is listed with that worker, its lease and
    its ttr end, and the worker's link leads to the workers holding the queue's jobs."""
    q = "daily"
    for _ in range(4):
        assert api.put(f"/api/{NS}/{q}", content=b"x").status_code == 201
    first, second = api.get(f"/api/{NS}/{q}", params={"ttr": 60, "count": 2}).json()
    assert api.delete(f"/api/{NS}/{q}/job/{first['job_id']}").status_code == 204
    now = int(datetime.now(timezone.utc).timestamp() * 1000)
    held = [{"queue": q, "job_id": second["job_id"], "started_ms": now - 3_000}]
    info = {"host": "web-9", "pid": 99, "queues": [q], "concurrency": 2, "in_flight": held}
    assert api.put(f"/api/{NS}/_workers/web-9-99", json=info).status_code == 200
    page = Page(browser, own_service.admin)

    def shows_the_work() -> bool:
        page.open(f"/queue/{NS}/{q}")  # the fragment reloads once a minute: the page, sooner
        page.wait(lambda: page.all("#h-published"), "the history panel")
        return page.find("#h-published").text == "4" and page.find("#h-acked").text == "1"

    page.wait(shows_the_work, "the work in the 24-h charts")
    assert page.find("#h-delivered").text == "2"
    assert page.find("#history-rates polyline.h-pub").get_attribute("points")
    ticks = [t.text for t in page.all("#history-rates text.tick[data-tick-ms]")]
    assert ticks and all(re.fullmatch(r"\d\d:00 UTC", t) for t in ticks), ticks
    row = page.find(f'#in-flight tr[data-job-id="{second["job_id"]}"]')
    assert row.get_attribute("data-worker") == "web-9-99"
    assert second["lease"] in row.text and "UTC" in row.text
    page.d.execute_script("arguments[0].scrollIntoView()", page.find("#in-flight"))
    shot(browser, "queue-in-flight")
    page.d.execute_script("arguments[0].scrollIntoView()", page.find("#history"))
    shot(browser, "queue-history-24h")
    row.find_element(By.CSS_SELECTOR, "td:nth-child(2) a").click()
    page.wait(lambda: page.all('tr[data-worker="web-9-99"]'), "the worker holding it")
    assert "q=daily" in browser.current_url
    shot(browser, "in-flight-worker")
    api.delete(f"/api/{NS}/_workers/web-9-99")
    api.delete(f"/api/{NS}/{q}/job/{second['job_id']}")


def test_a_group_paused_and_resumed_and_its_numbers_following(
    browser: WebDriver, own_service: ServiceProcess, api: httpx.Client, shot: Any
) -> None:
    """The queue page's Groups panel: a group paused from it holds its jobs back while another
    group's go to a worker (the panel's numbers follow with no reload), resumed it lets them
    go; its limits set from its row's form; the job page's group leads back to the panel."""
    q = "tenants"
    ids = [
        api.put(f"/api/{NS}/{q}", params={"group": g}, content=b"x").json()["job_id"]
        for g in ("acme", "acme", "acme", "beta")
    ]
    page = Page(browser, own_service.admin)

    def numbers(g: str) -> dict[str, str] | None:  # read in one go: the panel is replaced
        return browser.execute_script(  # type: ignore[no-any-return]
            "var r = document.querySelector('#groups tr[data-group=\"' + arguments[0] + '\"]');"
            "if (!r) return null; var o = {paused: r.dataset.paused};"
            "['size', 'reserved', 'held', 'concurrency', 'rate'].forEach(function (k) {"
            "o[k] = r.querySelector('[data-group-' + k + ']').textContent.trim(); });"
            "return o;",
            g,
        )

    def shows(g: str, **want: str) -> bool:
        got = numbers(g)
        return got is not None and all(got[k] == v for k, v in want.items())

    page.open(f"/job/{NS}/{q}/{ids[0]}")
    assert page.find("#job-group").text == "acme"
    page.click("#job-group a")
    page.wait(lambda: shows("acme", size="3", held="0", paused="false"), "the groups panel")
    assert browser.current_url.endswith("#groups")
    assert shows("beta", size="1", reserved="0")
    shot(browser, "groups")

    page.click('#groups tr[data-group="acme"] form.group-pause button')
    assert "group acme of shop/tenants paused" in page.flash()
    page.wait(lambda: shows("acme", paused="true"), "acme paused")
    page.d.execute_script("document.body.setAttribute('data-loaded-once', 'yes')")
    got = api.get(f"/api/{NS}/{q}", params={"ttr": 60, "count": 10}).json()
    assert [j["group"] for j in got] == ["beta"]  # acme's held back, beta's delivered
    page.wait(
        lambda: shows("acme", held="3", reserved="0") and shows("beta", reserved="1"),
        "the held and in-flight numbers to follow",
    )
    assert page.find("body").get_attribute("data-loaded-once") == "yes"  # no reload
    shot(browser, "group-paused-held")

    page.click('#groups tr[data-group="acme"] form.group-resume button')
    assert "group acme of shop/tenants resumed" in page.flash()
    page.wait(lambda: shows("acme", paused="false", held="0"), "acme resumed")
    got = api.get(f"/api/{NS}/{q}", params={"ttr": 60, "count": 10}).json()
    assert sorted(j["job_id"] for j in got) == sorted(ids[:3])
    page.wait(lambda: shows("acme", reserved="3"), "acme's jobs in flight")
    shot(browser, "group-resumed")

    # a row's form being filled in is not thrown away by the panel's refresh (every 5 s) ...
    typed = '#groups tr[data-group="beta"] form.group-limits input[name=concurrency]'
    box = page.wait(lambda: page.find(typed).send_keys("7") or page.find(typed), "typing")
    loaded = page.find("#groups-src").get_attribute("data-panel-loaded")
    time.sleep(6)
    assert box.get_attribute("value") == "7"  # the same element, still there
    assert page.find("#groups-src").get_attribute("data-panel-loaded") == loaded
    # ... and once it is left as it showed, the panel is refreshed again
    box.clear()
    page.d.execute_script("document.activeElement.blur()")
    page.wait(
        lambda: page.find("#groups-src").get_attribute("data-panel-loaded") != loaded,
        "the panel refreshed again",
    )

    page.submit('#groups tr[data-group="acme"] form.group-limits', concurrency="2", rate="5/1s")
    assert "concurrency limit 2, rate limit 5/1000ms" in page.flash()
    page.wait(lambda: shows("acme", concurrency="2", rate="5/1000ms"), "acme's limits")
    shot(browser, "group-limits")
    api.delete(f"/api/{NS}/{q}")
