"""Observability through a real `cluster-dq serve` with two worker processes: traffic goes in
through HTTP, and /metrics (summed over both workers), /readyz and the access log must show it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from cluster_dq import metrics
from cluster_dq.localredis import Server
from tests.support import ADMIN_AUTH, serve


@pytest.fixture(scope="module")
def svc(redis_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    log_path = tmp_path_factory.mktemp("metrics") / "stderr.log"
    with open(log_path, "wb") as log_file:
        svc = serve(
            f"127.0.0.1:{redis_server.port}",
            stderr=log_file,
            CLUSTER_DQ_WORKERS="2",
            CLUSTER_DQ_SIZEINTERVALSECOND="0.5",
            CLUSTER_DQ_LOGLEVEL="info",
        )
        proc, base, admin = svc.proc, svc.base, svc.admin
        token = httpx.post(f"{admin}/token/obs", params={"description": "metrics"}, auth=ADMIN_AUTH)
        yield {
            "base": base,
            "admin": admin,
            "token": token.json()["token"],
            "log": log_path,
            "pid": proc.pid,
        }
        svc.stop(timeout=20)


def scrape(admin: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    r = httpx.get(f"{admin}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def wait_for(check: Any, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_counters_histograms_and_sizes_follow_the_traffic(svc: dict[str, Any]) -> None:
    q = {"namespace": "obs", "queue": "work"}
    before = scrape(svc["admin"])
    # Fresh connections each time, so both workers serve some of the requests.
    h = {"X-Token": svc["token"]}
    ids = [
        httpx.put(f"{svc['base']}/api/obs/work", headers=h, content=b"x").json()["job_id"]
        for _ in range(6)
    ]
    r = httpx.put(f"{svc['base']}/api/obs/work/bulk", headers=h, content=json.dumps(["a", "b"]))
    assert r.status_code == 201
    delivered = []
    for _ in range(3):
        r = httpx.get(f"{svc['base']}/api/obs/work", headers=h, params={"ttr": 60})
        assert r.status_code == 200
        delivered.append(r.json()["job_id"])
    for jid in delivered[:2]:
        assert httpx.delete(f"{svc['base']}/api/obs/work/job/{jid}", headers=h).status_code == 204
    # One job that dies: 1 try, ttr 1 s, never acked -> dead letter, then respawned.
    httpx.put(f"{svc['base']}/api/obs/dies", headers=h, params={"tries": 1}, content=b"d")
    assert httpx.get(f"{svc['base']}/api/obs/dies", headers=h, params={"ttr": 1}).status_code == 200
    assert httpx.get(f"{svc['base']}/api/obs/nothing", headers=h).status_code == 404

    def dead_seen() -> bool:
        s = scrape(svc["admin"])
        return value(s, "cluster_dq_jobs_dead_lettered_total", queue="dies") == 1

    assert wait_for(dead_seen), "the ttr expiry never reached the dead-letter counter"
    r = httpx.put(f"{svc['base']}/api/obs/dies/deadletter", headers=h, params={"limit": 5})
    assert r.json()["count"] == 1

    def sizes_fresh() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        s = scrape(svc["admin"])
        ok = value(s, "cluster_dq_queue_jobs", queue="work", state="ready") == 5
        ok = ok and value(s, "cluster_dq_queue_jobs", queue="dies", state="ready") == 1
        # The respawn's counter reaches the files at its worker's next flush (within 1 s), which
        # may come after the shard leader's next size post: wait for both.
        name = "cluster_dq_jobs_respawned_total"
        ok = ok and value(s, name, queue="dies") - value(before, name, queue="dies") == 1
        return s if ok else None

    after = wait_for(sizes_fresh)
    assert after, "the shard leaders never posted the queue sizes"

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("cluster_dq_jobs_published_total", **q) == 8
    assert delta("cluster_dq_jobs_delivered_total", **q) == 3
    assert delta("cluster_dq_jobs_acked_total", **q) == 2
    assert delta("cluster_dq_jobs_ttr_expired_total", queue="dies") == 1
    assert delta("cluster_dq_jobs_dead_lettered_total", queue="dies") == 1
    assert delta("cluster_dq_jobs_respawned_total", queue="dies") == 1
    assert delta("cluster_dq_jobs_ttl_expired_total", **q) == 0
    # Sizes by state: 8 published, 2 acked, 1 still reserved.
    assert value(after, "cluster_dq_queue_jobs", queue="work", state="reserved") == 1
    assert value(after, "cluster_dq_queue_jobs", queue="work", state="delayed") == 0
    assert value(after, "cluster_dq_queue_jobs", queue="dies", state="dead") == 0
    # Lateness and publish-to-first-delivery: one observation per first delivery.
    assert delta("cluster_dq_job_lateness_seconds_count", **q) == 3
    assert delta("cluster_dq_publish_to_first_delivery_seconds_count", **q) == 3
    assert delta("cluster_dq_job_lateness_seconds_bucket", le="+Inf", **q) == 3
    # HTTP by route template, method and status: never a raw path or a job id.
    assert (
        delta("cluster_dq_http_requests_total", route="/api/{ns}/{q}", method="PUT", status="201")
        >= 7
    )
    assert (
        delta(
            "cluster_dq_http_requests_total",
            route="/api/{ns}/{q}/job/{job_id}",
            method="DELETE",
            status="204",
        )
        == 2
    )
    assert delta("cluster_dq_http_requests_total", route="/api/{ns}/{queues}", status="404") == 1
    assert delta("cluster_dq_http_request_duration_seconds_count", route="/api/{ns}/{q}/bulk") == 1
    labels = {v for (_, ls) in after for _, v in ls}
    assert not labels & set(ids) and not any("/api/obs/" in v for v in labels)
    # Redis round trips are timed; every one of the 16 shards has exactly one leader.
    assert value(after, "cluster_dq_redis_call_duration_seconds_count", pool="default") > 0
    assert value(after, "cluster_dq_pump_leader", pool="default") == 16
    assert value(after, "cluster_dq_pump_batches_total", pool="default") >= 1


def test_readyz_reloads_flushed_scripts(svc: dict[str, Any], redis_server: Server) -> None:
    assert httpx.get(f"{svc['admin']}/healthz").json() == {"status": "ok"}
    client = redis.Redis(port=redis_server.port)
    client.script_flush()
    r = httpx.get(f"{svc['admin']}/readyz", auth=ADMIN_AUTH)  # the pools: to an admin only
    assert r.status_code == 200 and r.json()["pools"]["default"] == {"redis": True, "scripts": True}
    assert client.script_exists(*[s for s in _shas()]) == [True] * len(_shas())


def _shas() -> list[str]:
    from cluster_dq.engine.scripts import load_all

    import hashlib

    return [hashlib.sha1(s.source.encode()).hexdigest() for s in load_all().values()]


def test_access_log_switch_reaches_every_worker(svc: dict[str, Any]) -> None:
    admin, base, h = svc["admin"], svc["base"], {"X-Token": svc["token"]}
    r = httpx.post(f"{admin}/accesslog", params={"status": "enable"}, auth=ADMIN_AUTH)
    assert r.json() == {"status": "enabled"}
    # New connections land on either worker: every one of them must see the switch.
    assert all(httpx.get(f"{admin}/accesslog").json()["status"] == "enabled" for _ in range(20))
    for _ in range(10):
        httpx.get(f"{base}/api/obs/logged", headers={**h, "X-Request-ID": "trace-me"})
    httpx.post(f"{admin}/accesslog", params={"status": "disable"}, auth=ADMIN_AUTH)
    assert all(httpx.get(f"{admin}/accesslog").json()["status"] == "disabled" for _ in range(20))
    httpx.get(f"{base}/api/obs/logged", headers={**h, "X-Request-ID": "not-logged"})

    def lines() -> list[dict[str, Any]]:
        out = []
        for line in Path(svc["log"]).read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("logger") == "cluster_dq.access":
                out.append(rec)
        return out

    logged = wait_for(lambda: [r for r in lines() if r.get("request_id") == "trace-me"] or None)
    assert logged and len(logged) == 10
    rec = logged[0]
    assert (rec["namespace"], rec["queue"], rec["status"]) == ("obs", "logged", 404)
    assert rec["route"] == "/api/{ns}/{queues}" and rec["method"] == "GET"
    assert not [r for r in lines() if r.get("request_id") == "not-logged"]


def test_observe_many_equals_observing_one_value_at_a_time() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from cluster_dq.metrics import LATENESS_BUCKETS, observe_many

    registry = CollectorRegistry()
    one = Histogram("one", "h", buckets=LATENESS_BUCKETS, registry=registry)
    many = Histogram("many", "h", buckets=LATENESS_BUCKETS, registry=registry)
    values = [0, 0.001, 0.0010001, 0.003, 0.05, 0.05, 2.5, 7, 1e6] + [i / 997 for i in range(500)]
    for chunk in (values[:2], values[2:9], values[9:]):  # below and above the bulk threshold
        for v in chunk:
            one.observe(v)
        observe_many(many, chunk)

    def samples(name: str) -> list[tuple[str, dict[str, str], float]]:
        (family,) = [f for f in registry.collect() if f.name == name]
        return [
            (s.name.removeprefix(name), s.labels, s.value)
            for s in family.samples
            if "created" not in s.name
        ]

    got, want = samples("many"), samples("one")
    assert [s[:2] for s in got] == [s[:2] for s in want]
    assert [s[2] for s in got] == pytest.approx([s[2] for s in want])
    assert dict((s[0], s[2]) for s in want)["_count"] == len(values)


def test_metrics_are_injected_and_a_disabled_recorder_records_nothing() -> None:
    """``EnableMetrics`` and ``MetricsMaxQueues`` reach the recorder a runtime passes around
    (no module global); the disabled variant records nothing and still labels sizes."""
    from prometheus_client import REGISTRY

    from cluster_dq import metrics
    from cluster_dq.settings import Settings

    def published(ns: str) -> float:
        return sum(
            s.value
            for f in REGISTRY.collect()
            if f.name == "cluster_dq_jobs_published"
            for s in f.samples
            if s.labels.get("namespace") == ns and s.name.endswith("_total")
        )

    off = metrics.Metrics.from_settings(Settings(EnableMetrics=False, MetricsMaxQueues=1))
    assert isinstance(off, metrics.NoMetrics) and not off.enabled
    off.count(metrics.published, "inject-off", "q", 3)
    off.http("data", "/x", "GET", 200, 0.1)
    off.pool("default").moved("inject-off", "q", 1, 1, 1, 1)
    assert published("inject-off") == 0
    assert off.queue_labels("inject-off", "a") == ("inject-off", "a")
    assert off.queue_labels("inject-off", "b") == (
        "inject-off",
        metrics.OTHER_QUEUE,
    )  # the cap still holds
    on = metrics.Metrics.from_settings(Settings(MetricsMaxQueues=2))
    assert on.enabled and on.max_queues == 2
    for q in ("a", "b", "c", "d"):
        on.count(metrics.published, "inject-on", q, 1)
    assert published("inject-on") == 4
    assert {
        s.labels["queue"]
        for f in REGISTRY.collect()
        if f.name == "cluster_dq_jobs_published"
        for s in f.samples
        if s.labels.get("namespace") == "inject-on"
    } == {"a", "b", metrics.OTHER_QUEUE}
    # A second recorder has caps of its own: nothing is shared through the module.
    assert metrics.Metrics(1).queue_labels("inject-on", "z") == ("inject-on", "z")


def _established_per_process(pids: list[int], port: int) -> dict[int, int]:
    """Established TCP connections to local ``port`` held by each process (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "01":
                inodes.add(f"socket:[{f[9]}]")
    out = {}
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        out[pid] = sum(1 for fd in fds.iterdir() if _readlink(fd) in inodes)
    return out


def _readlink(path: Path) -> str:
    try:
        return str(path.readlink())
    except OSError:
        return ""


def test_a_burst_of_connections_is_spread_over_the_workers(svc: dict[str, Any]) -> None:
    """A shared listening socket let the first worker awake accept a whole burst (a load
    balancer opening its keep-alive pool), leaving the other idle; each worker now listens
    on its own SO_REUSEPORT socket and the kernel spreads the connections."""
    import socket

    children = Path(f"/proc/{svc['pid']}/task/{svc['pid']}/children").read_text().split()
    port = int(svc["base"].rsplit(":", 1)[1])
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
    try:
        deadline = time.monotonic() + 5
        while True:
            held = _established_per_process([int(c) for c in children], port)
            if sum(held.values()) == 32 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        workers = sorted(n for n in held.values() if n)  # the resource tracker holds none
        assert sum(workers) == 32 and len(workers) == 2 and workers[0] >= 4, held
    finally:
        for s in socks:
            s.close()


async def test_a_buffered_recorder_reaches_the_exposition_at_flush_and_loses_nothing() -> None:
    """``serve`` buffers counts and observations in the worker and flushes them every second
    and before a scrape: between flushes nothing shows, after one everything does, exactly;
    the flusher flushes once more as it is stopped (shutdown)."""
    import asyncio

    from prometheus_client import REGISTRY

    from cluster_dq import metrics

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    rec = metrics.Metrics(10, buffered=True)
    lbl = {"namespace": "buffered", "queue": "q"}
    http = {"port": "data", "route": "/buffered", "method": "PUT"}
    rec.count(metrics.published, "buffered", "q", 3)
    rec.count(metrics.published, "buffered", "q", 2)
    for seconds in (0.0001, 0.002, 0.3):
        rec.http("data", "/buffered", "PUT", 201, seconds)
    assert sample("cluster_dq_jobs_published_total", **lbl) == 0
    assert sample("cluster_dq_http_request_duration_seconds_count", **http) == 0
    rec.flush()
    assert sample("cluster_dq_jobs_published_total", **lbl) == 5
    assert sample("cluster_dq_http_request_duration_seconds_count", **http) == 3
    assert sample("cluster_dq_http_request_duration_seconds_sum", **http) == pytest.approx(0.3021)
    assert sample("cluster_dq_http_request_duration_seconds_bucket", le="0.001", **http) == 1
    rec.count(metrics.published, "buffered", "q", 1)
    flusher = asyncio.create_task(rec.flush_every(3600))
    await asyncio.sleep(0)
    flusher.cancel()
    await asyncio.gather(flusher, return_exceptions=True)
    assert sample("cluster_dq_jobs_published_total", **lbl) == 6
    for _ in range(metrics.FLUSH_AT + 1):  # the buffer is bounded whatever the period
        rec.http("data", "/buffered", "PUT", 201, 0.01)
    assert sample("cluster_dq_http_request_duration_seconds_count", **http) > 3


def test_a_worker_file_gone_while_a_scrape_reads_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead worker's counter files are removed by the supervisor: one listed but gone when
    read (here a dangling link, gone every time) is left out of the scrape instead of making
    /metrics (and the dashboard's rates) fail, and the live workers' counters are all there."""
    worker = (
        "from prometheus_client import Counter\n"
        "Counter('probe_jobs', 'probe', ['queue']).labels('q').inc(7)\n"
    )
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", worker], env=env, check=True)
    (tmp_path / "counter_999999.db").symlink_to(tmp_path / "gone.db")
    monkeypatch.setenv(metrics.MULTIPROC_ENV, str(tmp_path))
    text = metrics.render(metrics.SizeBoard(None, 60))[0].decode()
    assert 'probe_jobs_total{queue="q"} 7.0' in text
