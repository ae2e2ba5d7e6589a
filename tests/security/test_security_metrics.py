"""Label cardinality and the scrape (issue 25, item 5): requests without a token cannot grow the
metrics, and rendering ``/metrics`` does not hold up the worker's other requests.

Before: any of the ~35 methods the HTTP parser accepts, on any path, added series (a method
label per method, 405 on every route template), so 943 requests took a scrape from 68 to 16,889
series; and the scrape was rendered inside the worker's event loop, which also serves the
data port. The scrape's time is measured by ``loadtest/bench_scrape.py``, not asserted here."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster_dq import metrics
from cluster_dq.http.exposition import Exposition
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.http.admin import create_admin_app
from cluster_dq.http.app import create_data_app
from cluster_dq.http.middleware import AccessLog
from cluster_dq.localredis import Server
from cluster_dq.metrics import SizeBoard
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import load
from cluster_dq.testing.odd_requests import MARK, name, odd_request
from tests.support import ADMIN_AUTH, serve

SERVED = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"}  # every method some route serves


def samples(admin: str) -> list[Any]:
    r = httpx.get(f"{admin}/metrics", timeout=30)
    assert r.status_code == 200
    return [s for family in text_string_to_metric_families(r.text) for s in family.samples]


@pytest.fixture(scope="module")
def svc(redis_server: Server) -> Iterator[tuple[str, str, str]]:
    """A fresh service (multiprocess series stay until a restart), one worker."""
    service = serve(f"127.0.0.1:{redis_server.port}", CLUSTER_DQ_WORKERS="1")
    token = httpx.post(
        f"{service.admin}/token/sec", params={"description": "metrics"}, auth=ADMIN_AUTH
    ).json()["token"]
    yield service.base, service.admin, token
    service.stop(timeout=20)


def test_odd_requests_without_a_token_add_a_bounded_number_of_series(
    svc: tuple[str, str, str],
) -> None:
    """1,000 requests with random methods on random paths of both ports, with no token or a
    junk one: the http series take only route templates with a method they serve, or
    ("unmatched", "other"), and the app's status codes; no label holds a name from a path or
    a token; the count of new series stays under a bound."""
    base, admin, _ = svc
    rng = random.Random(25)
    before = len(samples(admin))
    statuses: set[int] = set()
    with httpx.Client(timeout=30) as client:
        for i in range(1000):
            method, path = odd_request(rng)
            params = {"token": name(rng)} if i % 3 == 0 else {}
            port = admin if i % 2 else base
            r = client.request(method, port + path, params=params)
            statuses.add(r.status_code)
    assert {404, 405} <= statuses and 500 not in statuses
    after = samples(admin)
    # Before the fix the same requests added about 6,000 series (943 others: 16,889); since,
    # about 200, most of them the histograms of the admin routes served without accounts.
    assert len(after) - before < 600, (before, len(after))
    http = [s for s in after if s.name.startswith("cluster_dq_http_")]
    assert http
    for s in after:
        leaked = [v for v in s.labels.values() if MARK in v]
        assert not leaked, f"{s.name} {s.labels}: a label from a request's path or token"
    for s in http:
        route, method = s.labels["route"], s.labels["method"]
        assert route == "unmatched" or route.startswith("/"), s.labels
        assert method in SERVED or method == "other", s.labels
        # What no route serves (no route for the path, or not that method) is one label pair.
        assert (route == "unmatched") == (method == "other"), s.labels
        if "status" in s.labels:
            assert int(s.labels["status"]) in metrics.STATUSES, s.labels
        else:  # the histogram: neither what no route served nor what was refused for its token
            assert route != "unmatched", s.labels


def test_a_401_on_random_queues_adds_no_per_queue_series(svc: tuple[str, str, str]) -> None:
    """Requests refused for their token name namespaces and queues in their paths; none of
    those names become labels: only a valid token's own queues get per-queue series."""
    base, admin, token = svc
    rng = random.Random(401)
    names = [(name(rng), name(rng)) for _ in range(50)]
    with httpx.Client(base_url=base, timeout=30) as client:
        for ns, q in names:
            assert client.put(f"/api/{ns}/{q}", content=b"x").status_code == 401
            assert client.get(f"/api/{ns}/{q}", params={"token": "junk"}).status_code == 401
            r = client.delete(f"/api/{ns}/{q}/job/{name(rng)}", params={"token": token})
            assert r.status_code == 401  # a valid token, another namespace
        assert client.put("/api/sec/mine", params={"token": token}, content=b"x").status_code == 201
    after = samples(admin)
    assert not [s for s in after if any(MARK in v for v in s.labels.values())]
    acks = {"port": "data", "route": "/api/{ns}/{q}/job/{job_id}", "method": "DELETE"}
    refused = [s for s in after if s.name == "cluster_dq_http_requests_total"]
    assert [s.value for s in refused if s.labels == {**acks, "status": "401"}][0] >= 50
    timed = [s for s in after if s.name.startswith("cluster_dq_http_request_duration")]
    assert not [s for s in timed if acks.items() <= s.labels.items()]  # 401s are not timed
    assert any(
        s.labels.get("namespace") == "sec" and s.labels.get("queue") == "mine" for s in after
    )


@pytest.fixture
def apps(redis_server: Server) -> Iterator[tuple[asyncio.Runner, Service, Any, Any]]:
    """The data and the admin app of one service, in one event loop (as a worker serves
    both ports), called in process."""
    settings = load(None, {"CLUSTER_DQ_POOL__DEFAULT__ADDR": f"127.0.0.1:{redis_server.port}"})
    with asyncio.Runner() as runner:
        pool = RedisPool.create(settings.Pool["default"], EngineConfig())
        runner.run(pool.start(run_pump=False))
        service = Service(settings, {"default": pool})
        log = AccessLog(False)
        data = create_data_app(service, settings, log)
        admin = create_admin_app(service, settings, log, SizeBoard(None, 30.0))
        try:
            yield runner, service, data, admin
        finally:
            runner.run(pool.close())


def test_a_data_request_is_answered_while_a_scrape_renders(
    apps: tuple[asyncio.Runner, Service, Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A render held in progress (it waits for an event the test sets): a data request on the
    same event loop gets its answer meanwhile, and scrapes that arrive during the render share
    it (one render, not one each). Rendered on the event loop, the held render would block
    the loop, and the data request would be answered only after the scrape."""
    runner, service, data_app, admin_app = apps
    entered, release = threading.Event(), threading.Event()
    renders = []
    real = metrics.render

    def held_render(board: SizeBoard) -> tuple[bytes, str]:
        renders.append(threading.get_ident())
        entered.set()
        release.wait(10)
        return real(board)

    monkeypatch.setattr(metrics, "render", held_render)

    async def scenario() -> None:
        token = await service.create_token("default", "ns", "test", "scrape-token-0123456789")
        data = httpx.AsyncClient(transport=httpx.ASGITransport(data_app), base_url="http://dq")
        admin = httpx.AsyncClient(transport=httpx.ASGITransport(admin_app), base_url="http://dq")
        async with data, admin:
            scrapes = [asyncio.create_task(admin.get("/metrics")) for _ in range(3)]
            for _ in range(1000):
                if entered.is_set():
                    break
                await asyncio.sleep(0.01)
            assert entered.is_set()
            r = await data.put("/api/ns/q", params={"token": token}, content=b"job")
            assert r.status_code == 201
            assert not any(s.done() for s in scrapes), "the scrape blocked the event loop"
            release.set()
            answers = await asyncio.gather(*scrapes)
        assert all(a.status_code == 200 for a in answers)
        assert all(b"cluster_dq_http_requests" in a.content for a in answers)
        assert len(renders) == 1 and renders[0] != threading.get_ident()

    try:
        runner.run(scenario())
    finally:
        release.set()


async def test_a_slow_render_is_reused_for_a_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A render is reused for 4x as long as it took, but never past ``REUSE_MAX_S``: a minute's
    render is not served for four minutes. (The clock is the exposition's own: no waiting.)"""
    now = [1000.0]
    renders: list[float] = []

    def slow_render(board: Any) -> tuple[bytes, str]:
        renders.append(now[0])
        now[0] += 60.0  # the render took a minute
        return b"# rendered\n", "text/plain"

    monkeypatch.setattr(metrics, "render", slow_render)
    exposition = Exposition(board=None, clock=lambda: now[0])  # type: ignore[arg-type]
    await exposition.render()
    now[0] += Exposition.REUSE_MAX_S - 0.1
    await exposition.render()
    assert len(renders) == 1  # reused while fresh
    now[0] += 0.2
    await exposition.render()
    assert len(renders) == 2  # past REUSE_MAX_S: rendered again, not 4 minutes later
