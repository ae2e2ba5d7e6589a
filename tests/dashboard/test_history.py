"""A queue's 24-h history and its in-flight list, over HTTP against real services on the
suite's topology: what happened (published, delivered, acked, released, buried, a ttr that
ran out in the pump) is in the queue's 5-minute bucket in Redis and on the page; two
instances' counts add up; a stop flushes what was counted and a new instance shows it; an
idle queue is written nothing; the page lists the reserved jobs with the worker holding each,
its lease, start and ttr end, at most 50, and says how many more."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from cluster_dq import history
from cluster_dq.clock import now_ms
from cluster_dq.keys import QueueKeys
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH, Deployment, serve
from tests.support.dashboard import NS, consume, publish

EVERY_S = "1"  # the services here flush their counts every second
WAIT_S = 15.0


@pytest.fixture(scope="module")
def service(deployment: Deployment) -> Iterator[ServiceProcess]:
    """This module's own service, flushing its history every second (the suite's keep none)."""
    svc = serve(deployment.pool_settings(), CLUSTER_DQ_HISTORYFLUSHSECOND=EVERY_S)
    yield svc
    svc.stop(timeout=20)


def token(svc: ServiceProcess) -> str:
    r = httpx.post(f"{svc.admin}/token/{NS}", params={"description": "t"}, auth=ADMIN_AUTH)
    return str(r.json()["token"])


def shown(page: str) -> dict[str, int]:
    """The 24-h totals a history fragment shows, by name."""
    return {k: int(v) for k, v in re.findall(r'id="h-([a-z-]+)">(\d+)<', page)}


def wait_for(ui: httpx.Client, q: str, ok: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """The fragment's totals once ``ok`` holds for them (each instance flushes every second)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        r = ui.get(f"/panels/history/{NS}/{q}")
        assert r.status_code == 200, r.text
        got = shown(r.text)
        if ok(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def history_keys(sync_redis: redis.Redis, q: str) -> list[bytes]:
    pattern = QueueKeys(NS, q).history(0).replace("{", "\\{").replace("}", "\\}")[:-1] + "*"
    return sorted(k for k in sync_redis.scan_iter(match=pattern, count=1000))  # type: ignore[union-attr]


def test_what_happened_is_in_the_bucket_and_on_the_page(
    api: httpx.Client, ui: httpx.Client, sync_redis: redis.Redis
) -> None:
    q = "hist"
    for _ in range(5):
        publish(api, q, tries=3)  # the release puts its job back, not into the dead letter
    jobs = api.get(f"/api/{NS}/{q}", params={"ttr": 60, "count": 3}).json()
    assert len(jobs) == 3
    for j in jobs[:2]:
        r = api.delete(f"/api/{NS}/{q}/job/{j['job_id']}", params={"lease": j["lease"]})
        assert r.status_code == 204
    r = api.post(f"/api/{NS}/{q}/job/{jobs[2]['job_id']}/release", params={"delay": 0})
    assert r.status_code == 200, r.text
    jid = publish(api, q)
    assert api.post(f"/api/{NS}/{q}/job/{jid}/bury").status_code == 200
    got = wait_for(ui, q, lambda t: t.get("published") == 6 and t.get("dead") == 1)
    assert got["published"] == 6
    assert got["delivered"] == 3
    assert got["acked"] == 2
    assert got["released"] == 1
    assert got["dead"] == 1
    assert got["redelivered"] == got["ttr-expired"] == 0

    # one hash for the bucket of now, on the queue's slot, gone 24 h after the bucket began
    (key,) = history_keys(sync_redis, q)
    bucket = int(key.rsplit(b":", 1)[1])
    assert abs(bucket - history.bucket_of(now_ms())) <= 1
    fields = {k.decode(): int(v) for k, v in sync_redis.hgetall(key).items()}  # type: ignore[union-attr]
    assert {f: fields[f] for f in "pdfarx"} == {"p": 6, "d": 3, "f": 3, "a": 2, "r": 1, "x": 1}
    assert fields["n"] == 3 and sum(v for f, v in fields.items() if f.startswith("h")) == 3
    before = now_ms()
    ttl: int = sync_redis.pttl(key)  # type: ignore[assignment]
    left = history.expires_at(bucket) - before
    assert left - 5_000 <= ttl <= left + 50  # (Redis's clock and ours: a few ms apart)

    page = ui.get(f"/panels/history/{NS}/{q}").text
    # times in the page's one convention, labelled
    assert re.search(r'<time datetime="[0-9T:.-]+Z" data-ms="\d+">[0-9: .-]+ UTC</time>', page)
    assert re.findall(r'data-tick-ms="\d+">\d\d:00 UTC<', page)
    assert 'data-empty="false"' in page
    # p99 of three near-instant deliveries: within the lowest buckets
    assert "ms" in html.unescape(re.search(r'id="h-late-p99">(.*?)</b>', page).group(1))  # type: ignore[union-attr]


def test_a_ttr_run_out_in_the_pump_and_the_redelivery(api: httpx.Client, ui: httpx.Client) -> None:
    q = "hist-ttr"
    publish(api, q, tries=3)
    consume(api, q, ttr=1)
    # the pump puts it back when its ttr ends (nobody consumes meanwhile), then it is taken again
    time.sleep(1.5)
    again = api.get(f"/api/{NS}/{q}", params={"ttr": 60, "timeout": 5})
    assert again.status_code == 200 and again.json()["deliveries"] == 2
    got = wait_for(ui, q, lambda t: t.get("ttr-expired") == 1 and t.get("delivered") == 2)
    assert (got["ttr-expired"], got["delivered"], got["redelivered"]) == (1, 2, 1)


def test_an_idle_queue_is_written_nothing(
    api: httpx.Client, ui: httpx.Client, sync_redis: redis.Redis
) -> None:
    publish(api, "busy")
    publish(api, "resting", delay=3600)  # jobs at rest: no work, no history written
    wait_for(ui, "busy", lambda t: t.get("published") == 1)
    wait_for(ui, "resting", lambda t: t.get("published") == 1)
    before = {k: sync_redis.hgetall(k) for k in history_keys(sync_redis, "resting")}
    time.sleep(2.5)  # two flushes of every worker
    after = {k: sync_redis.hgetall(k) for k in history_keys(sync_redis, "resting")}
    assert after == before and len(before) == 1
    assert history_keys(sync_redis, "never") == []
    empty = ui.get(f"/panels/history/{NS}/never").text
    assert 'data-empty="true"' in empty and shown(empty)["published"] == 0


def test_two_instances_add_up(
    deployment: Deployment, service: ServiceProcess, ui: httpx.Client, sync_redis: redis.Redis
) -> None:
    with serve(deployment.pool_settings(), CLUSTER_DQ_HISTORYFLUSHSECOND=EVERY_S) as other:
        for svc, n in ((service, 3), (other, 4)):
            with httpx.Client(base_url=svc.base, headers={"X-Token": token(svc)}) as client:
                for _ in range(n):
                    publish(client, "fleet")
        assert wait_for(ui, "fleet", lambda t: t.get("published") == 7)["published"] == 7
        with httpx.Client(base_url=f"{other.admin}/ui", auth=ADMIN_AUTH) as ui2:
            assert wait_for(ui2, "fleet", lambda t: t.get("published") == 7)["published"] == 7


def test_a_stop_flushes_and_a_new_instance_shows_it(
    deployment: Deployment, service: ServiceProcess, ui: httpx.Client, sync_redis: redis.Redis
) -> None:
    # flushing every 5 min: only the flush at the stop can have written these counts
    with serve(deployment.pool_settings(), CLUSTER_DQ_HISTORYFLUSHSECOND="300") as slow:
        with httpx.Client(base_url=slow.base, headers={"X-Token": token(slow)}) as client:
            for _ in range(2):
                publish(client, "restart")
        assert history_keys(sync_redis, "restart") == []
    (key,) = history_keys(sync_redis, "restart")
    assert sync_redis.hget(key, "p") == b"2"
    assert wait_for(ui, "restart", lambda t: t.get("published") == 2)["published"] == 2


def test_bad_names_and_pools(ui: httpx.Client) -> None:
    assert ui.get(f"/panels/history/{NS}/_bad").status_code == 400
    assert ui.get(f"/panels/history/{NS}/q", params={"pool": "nope"}).status_code == 404


# -- the in-flight list -------------------------------------------------------------------------


def in_flight_rows(page: str) -> list[dict[str, Any]]:
    section = page[
        page.index('id="in-flight"') : page.index("</section>", page.index('id="in-flight"'))
    ]
    rows = []
    for jid, worker, body in re.findall(
        r'<tr data-job-id="([^"]+)" data-worker="([^"]*)">(.*?)</tr>', section, re.S
    ):
        lease = re.search(r"<code data-lease>([0-9a-f]+)</code>", body)
        rows.append(
            {
                "job_id": jid,
                "worker": worker,
                "lease": lease.group(1) if lease else None,
                "started": re.search(r"data-started>(.*?)</td>", body, re.S).group(1),  # type: ignore[union-attr]
                "ttr_ends": re.search(r"data-ttr-ends>(.*?)</td>", body, re.S).group(1),  # type: ignore[union-attr]
            }
        )
    return rows


def test_the_queue_page_lists_jobs_in_flight_with_their_workers(
    api: httpx.Client, ui: httpx.Client
) -> None:
    q = "flight"
    assert 'id="in-flight-none"' in ui.get(f"/queue/{NS}/{q}").text
    for _ in range(3):
        publish(api, q)
    jobs = api.get(f"/api/{NS}/{q}", params={"ttr": 60, "count": 3}).json()
    started = now_ms() - 2_000
    held = [{"queue": q, "job_id": j["job_id"], "started_ms": started} for j in jobs[:2]]
    info = {"host": "box-1", "pid": 7, "queues": [q], "concurrency": 4, "in_flight": held}
    assert api.put(f"/api/{NS}/_workers/box-1-7", json=info).status_code == 200

    rows = {r["job_id"]: r for r in in_flight_rows(ui.get(f"/queue/{NS}/{q}").text)}
    assert set(rows) == {j["job_id"] for j in jobs}
    for j in jobs:
        assert rows[j["job_id"]]["lease"] == j["lease"]
        assert " UTC</time>" in rows[j["job_id"]]["ttr_ends"]
    for j in jobs[:2]:
        assert rows[j["job_id"]]["worker"] == "box-1-7"
        assert " UTC</time>" in rows[j["job_id"]]["started"]
    assert rows[jobs[2]["job_id"]]["worker"] == ""
    assert rows[jobs[2]["job_id"]]["started"] == "—"


def test_the_in_flight_list_is_bounded(api: httpx.Client, ui: httpx.Client) -> None:
    q = "many"
    r = api.put(f"/api/{NS}/{q}/bulk", json=[i for i in range(56)])
    assert r.status_code == 201, r.text
    assert len(api.get(f"/api/{NS}/{q}", params={"ttr": 60, "count": 56}).json()) == 56
    page = ui.get(f"/queue/{NS}/{q}").text
    assert len(in_flight_rows(page)) == 50
    assert re.search(r'id="in-flight-more"[^>]*data-more="6"', page)
