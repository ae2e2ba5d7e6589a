"""The data of the dashboard's own panels, on every topology: the delay timeline (the precise
zset and the wheel buckets, drill-down, a bucket's reschedule guarded by each job's state), dead
letters grouped by error fingerprint and a group's redrive, the counter ring behind the
lateness and redelivery charts, and the topology view (pool kind, Sentinel master, Cluster
slots, pump leaders)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis.crc import key_slot

from cluster_dq.clock import now_ms
from cluster_dq.dashboard import charts, panels
from cluster_dq.engine import insight
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.errors import BadRequest, NotFound
from cluster_dq.keys import AdminKeys, QueueKeys, shard_of
from cluster_dq.localredis import Cluster, SentinelGroup, Server
from cluster_dq.models import JobSpec, JobState, id_due_ms_of_text
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import load
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import Deployment
from tests.support import ADMIN_AUTH, serve

NS = "dash"


@pytest.fixture
async def service(sync_redis: redis.Redis, deployment: Deployment) -> AsyncIterator[Service]:
    base = load(None, {})
    settings = dataclasses.replace(base, Pool={"default": deployment.pool_settings()})
    pool = RedisPool.create(settings.Pool["default"], EngineConfig())
    await pool.start(run_pump=False)
    yield Service(settings, {"default": pool})
    await pool.close()


async def publish(service: Service, q: str, n: int, **spec: Any) -> list[str]:
    route = service.route("default")
    out = await service.publish(route, NS, q, [JobSpec(b"x", **spec) for _ in range(n)])
    return [p.job_id for p in out]


def bin_of(t: panels.Timeline, due: int) -> panels.Bin:
    (found,) = [b for b in t.bins if b.start_ms <= due < b.end_ms]
    return found


# -- delay timeline --------------------------------------------------------------------------


async def test_the_timeline_counts_the_precise_zset_and_the_wheel(service: Service) -> None:
    """Jobs due in 2 s rest in the precise zset, jobs due in 2 h in wheel buckets, a client id
    due in 1 h in the zset too: each is counted once, in the bin of its due time."""
    route = service.route("default")
    soon = await publish(service, "tl", 3, delay_ms=2_000)
    later = await publish(service, "tl", 4, delay_ms=2 * 3_600_000, ttl_ms=0)
    await service.publish(route, NS, "tl", [JobSpec(b"c", delay_ms=3_600_000, job_id="mine-1")])
    now = now_ms()
    t = await panels.timeline(service, route, NS, "tl", now)
    assert t.width_ms == 5 * panels.MINUTE  # 2 h in at most 60 bins
    assert (t.total, t.outside, t.unread) == (8, 0, 0)
    assert all(b.end_ms - b.start_ms == t.width_ms for b in t.bins)
    dues = [id_due_ms_of_text(j) for j in soon + later]
    assert bin_of(t, dues[0] or 0).count == 3
    assert bin_of(t, dues[-1] or 0).count == 4
    assert bin_of(t, now + 3_600_000).count == 1
    assert sum(b.count for b in t.bins) == 8


async def test_narrow_bins_read_a_wheel_bucket_job_by_job(service: Service) -> None:
    """Under a minute of range the bins are 1 s wide, narrower than a wheel bucket (10 s): the
    bucket's jobs are placed by the due time their ids carry."""
    route = service.route("default")
    a = await publish(service, "narrow", 2, delay_ms=20_000)
    b = await publish(service, "narrow", 1, delay_ms=40_000)
    t = await panels.timeline(service, route, NS, "narrow", now_ms())
    assert t.width_ms == panels.SECOND and t.total == 3
    for job_id in a + b:
        due = id_due_ms_of_text(job_id) or 0
        assert bin_of(t, due).count >= 1
    assert sum(b.count for b in t.bins) == 3


async def test_the_bins_cover_a_range_whose_first_bin_starts_a_width_early(
    service: Service,
) -> None:
    """Bins start on a multiple of their width: with "now" just before a minute ends and a job
    due a little under an hour later, 60 one-minute bins from that minute's start would end
    before the job; the bins widen instead, and the job is in one."""
    route = service.route("default")
    await service.publish(route, NS, "edge", [JobSpec(b"e", delay_ms=3_600_000, job_id="e-1")])
    job = await service.peek_job(route, NS, "edge", "e-1")
    due = getattr(job, "due_ms", None)
    assert due is not None
    now = (due - 3_599_990) // 60_000 * 60_000 + 59_999  # 59.999 s into a minute
    t = await panels.timeline(service, route, NS, "edge", now)
    assert (t.total, t.outside, bin_of(t, due).count) == (1, 0, 1)
    assert t.width_ms == 5 * panels.MINUTE


async def test_wheel_buckets_past_the_bound_are_counted_not_placed(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look reads a bounded number of wheel buckets; the jobs of the others are reported as
    unread (the bucket count is exact), never lost from the total."""
    route = service.route("default")
    await publish(service, "bound", 2, delay_ms=2 * 3_600_000)
    await publish(service, "bound", 3, delay_ms=3 * 3_600_000)
    monkeypatch.setattr(insight, "MAX_WHEEL_BUCKETS", 1)
    t = await panels.timeline(service, route, NS, "bound", now_ms())
    assert (sum(b.count for b in t.bins), t.unread, t.total) == (2, 3, 5)


async def test_an_empty_queue_has_an_empty_timeline(service: Service) -> None:
    route = service.route("default")
    await publish(service, "none", 2)  # ready, not delayed
    t = await panels.timeline(service, route, NS, "none", now_ms())
    assert (t.bins, t.total) == ([], 0)


async def test_a_bucket_drills_down_and_reschedules_through_each_jobs_state(
    service: Service,
) -> None:
    """The drill-down lists the bin's jobs; rescheduling the bin moves each through the per-job
    reschedule: a job whose ttl ends before its new due time is refused and left where it was,
    the others move, and each move is audited."""
    route = service.route("default")
    hour = 3_600_000
    moved = await publish(service, "resched", 3, delay_ms=2 * hour, ttl_ms=0)
    (short,) = await publish(service, "resched", 1, delay_ms=2 * hour, ttl_ms=2 * hour + 60_000)
    await publish(service, "resched", 2, delay_ms=10 * 60_000)  # in another bin, untouched
    t = await panels.timeline(service, route, NS, "resched", now_ms())
    b = bin_of(t, id_due_ms_of_text(short) or 0)
    listed = await panels.bucket_jobs(service, route, NS, "resched", b.start_ms, b.end_ms)
    assert sorted(j.job_id for j in listed) == sorted(moved + [short])
    assert all(j.in_wheel for j in listed)
    audited: list[tuple[str, str, str]] = []

    async def audit(action: str, target: str, detail: str) -> None:
        audited.append((action, target, detail))

    out = await panels.reschedule_bucket(
        service, route, NS, "resched", b.start_ms, b.end_ms, shift_ms=hour, audit=audit
    )
    assert sorted(out.changed) == sorted(moved)
    assert [j for j, _ in out.skipped] == [short]
    assert "past the end of its ttl" in out.skipped[0][1]
    assert sorted(t for _, t, _ in audited) == sorted(f"{NS}/resched/{j}" for j in moved)
    assert {a for a, _, _ in audited} == {"reschedule"}
    due = id_due_ms_of_text(moved[0]) or 0  # one publish call: one due time
    later = await service.delayed_between(route, NS, "resched", due + hour, due + hour + 1, 10)
    assert sorted(j.job_id for j in later) == sorted(moved)
    for job_id in moved:
        job = await service.peek_job(route, NS, "resched", job_id)
        assert getattr(job, "state", None) is JobState.DELAYED
    after = await panels.bucket_jobs(service, route, NS, "resched", b.start_ms, b.end_ms)
    assert [j.job_id for j in after] == [short]
    # "run now": the bin's job becomes ready at once
    out = await panels.reschedule_bucket(
        service, route, NS, "resched", b.start_ms, b.end_ms, to_ms=0
    )
    assert out.changed == [short]
    job = await service.peek_job(route, NS, "resched", short)
    assert getattr(job, "state", None) is JobState.READY


async def test_made_ready_now_is_due_now_not_at_the_epoch(service: Service) -> None:
    """ "Make them ready now" (to=now, sent as 0) and a shift into the past gave the jobs a due
    time of 1970 or hours ago: each went ahead of every job already waiting in the queue. Now
    due at the pool's now at the earliest: behind what was ready before them."""
    route = service.route("default")
    (waiting,) = await publish(service, "rnow", 1)
    (soon,) = await publish(service, "rnow", 1, delay_ms=600_000)
    (later,) = await publish(service, "rnow", 1, delay_ms=900_000)
    await asyncio.sleep(0.01)
    due_soon, due_later = id_due_ms_of_text(soon) or 0, id_due_ms_of_text(later) or 0
    out = await panels.reschedule_bucket(
        service, route, NS, "rnow", due_soon, due_soon + 1, to_ms=0
    )
    assert out.changed == [soon]
    out = await panels.reschedule_bucket(
        service, route, NS, "rnow", due_later, due_later + 1, shift_ms=-10 * panels.DAY
    )
    assert out.changed == [later]
    order = [j.job_id for j in await service.consume(route, NS, ["rnow"], 30_000, 3, 0)]
    assert order == [waiting, soon, later]


async def test_bad_timeline_input_is_refused(service: Service) -> None:
    route = service.route("default")
    with pytest.raises(BadRequest):
        await panels.bucket_jobs(service, route, NS, "q", 10, 5)
    with pytest.raises(BadRequest):
        await panels.reschedule_bucket(service, route, NS, "q", 0, 10)
    with pytest.raises(BadRequest):
        await panels.reschedule_bucket(service, route, NS, "q", 0, 10, shift_ms=1, to_ms=1)


def test_bin_widths_suit_the_range() -> None:
    assert panels.choose_width(30_000) == panels.SECOND
    assert panels.choose_width(59 * 60_000) == panels.MINUTE
    assert panels.choose_width(20 * 3_600_000) == 30 * panels.MINUTE
    assert panels.choose_width(40 * panels.DAY) == panels.DAY
    assert panels.choose_width(10**15) == panels.WIDTHS[-1]


# -- dead letters by fingerprint ---------------------------------------------------------------


def test_fingerprints_normalise_what_varies() -> None:
    f = panels.fingerprint
    assert f("order 42 failed after 3.5s") == f("order 7 failed after 12s")
    assert f("user 'bob' not found") == f('user "alice" not found') == "user <str> not found"
    assert f("job 3f2a9c1e-0b7d-4e6f-8a21-9c0d1e2f3a4b gone") == "job <uuid> gone"
    assert f("bad hash deadbeef42 at 0x1F") == "bad hash <hex> at <hex>"
    assert f("card expired") != f("card declined")


async def test_dead_letters_group_by_reason_and_fingerprint_and_a_group_redrives(
    service: Service,
) -> None:
    route = service.route("default")
    ids = await publish(service, "dl", 6, tries=3)
    errors = [
        "order 42 failed: timeout after 30s",
        "order 7 failed: timeout after 5s",
        "order 9 failed: timeout after 1s",
        "user 'bob' not found",
        "user 'alice' not found",
        "card expired",
    ]
    for job_id, text in zip(ids, errors):
        await service.bury(route, NS, "dl", job_id, text)
    got = await panels.dead_groups(service, route, NS, "dl")
    assert got.complete and got.examined == 6
    shapes = [(g.reason, g.fingerprint, g.count) for g in got.groups]
    assert shapes == [
        ("buried", "order <n> failed: timeout after <n>s", 3),
        ("buried", "user <str> not found", 2),
        ("buried", "card expired", 1),
    ]
    orders = got.groups[0]
    assert orders.sample_error == errors[0] and sorted(orders.sample_ids) == sorted(ids[:3])
    assert orders.first_died_ms <= orders.last_died_ms
    audited: list[str] = []
    out = await panels.redrive_group(
        service,
        route,
        NS,
        "dl",
        orders.id,
        tries=2,
        ttl_ms=60_000,
        limit=2,
        audit=lambda action, target, detail: audited.append(f"{action} {target}"),
    )
    assert len(out.changed) == 2 and out.examined == 6 and not out.skipped
    assert audited == [f"kick {NS}/dl/{j}" for j in out.changed]
    for job_id in out.changed:
        job = await service.peek_job(route, NS, "dl", job_id)
        assert getattr(job, "state", None) is JobState.READY
        assert getattr(job, "tries_left", None) == 2
    after = await panels.dead_groups(service, route, NS, "dl")
    assert {g.fingerprint: g.count for g in after.groups}[orders.fingerprint] == 1
    assert (await service.sizes(route, NS, "dl")).dead == 4
    with pytest.raises(BadRequest):
        await panels.redrive_group(service, route, NS, "dl", "nope", tries=1, ttl_ms=0)


async def test_a_grouping_walk_is_bounded(service: Service) -> None:
    route = service.route("default")
    for job_id in await publish(service, "many", 5):
        await service.bury(route, NS, "many", job_id, f"row {job_id} bad")
    got = await panels.dead_groups(service, route, NS, "many", most=3)
    assert (got.examined, got.complete) == (3, False)
    # server ids are Crockford base32: the walked three group as the same error (digits gone)
    assert sum(g.count for g in got.groups) == 3


# -- lateness and redeliveries ---------------------------------------------------------------


async def test_the_counter_ring_shows_deliveries_redeliveries_and_lateness(
    service: Service,
) -> None:
    """Two samples around a first delivery, a ttr expiry and a redelivery: the chart's point
    counts them (from the service's own counters, as a scrape sees them)."""
    route = service.route("default")
    q = f"ring-{uuid.uuid4().hex[:8]}"  # the counters are process-wide: a queue of its own
    ring = charts.CounterRing(every_s=3600, keep=10)
    try:
        ring.watch(NS, q)  # its first sample, at once (the ring's loop may be mid-period)
        ring._task.cancel()  # type: ignore[union-attr]  # samples by hand from here
        await publish(service, q, 1, tries=2)
        (first,) = await service.consume(route, NS, [q], 100, 1, 0)
        await asyncio.sleep(0.25)
        (again,) = await service.consume(route, NS, [q], 60_000, 1, 0)
        assert (first.job_id, again.deliveries) == (again.job_id, 2)
        await service.release(route, NS, q, again.job_id, 0)  # its last try: dead
        ring.sample()
        (p,) = ring.series(NS, q)[-1:]
        assert (p.delivered, p.redelivered, p.ttr_expired, p.released, p.dead) == (2, 1, 1, 1, 1)
        assert p.late_p99_ms is not None and p.late_mean_ms is not None
        assert charts.polyline([0, p.delivered]).count(",") == 2
        assert charts.polyline([p.delivered]) == "0.0,1.0 300.0,1.0"  # one point: a flat line
    finally:
        await ring.close()


async def test_the_ring_is_bounded() -> None:
    reads: list[list[tuple[str, str]]] = []

    def read(queues: Any) -> dict[tuple[str, str], charts.Sample]:
        reads.append(list(queues))
        return {k: charts.Sample(0.0, {"delivered": 1.0}, ()) for k in queues}

    ring = charts.CounterRing(every_s=1, keep=3, max_queues=2, read=read)
    ring._task = asyncio.get_running_loop().create_future()  # type: ignore[assignment]
    # ^ stands for the sampling task, which would otherwise start: this test samples by hand
    for q in ("a", "b", "c"):
        ring.watch(NS, q)
    assert sorted(ring.rings) == [(NS, "b"), (NS, "c")]
    for _ in range(5):
        ring.sample()
    assert all(len(r) == 3 for r in ring.rings.values())


# -- topology ---------------------------------------------------------------------------------


async def test_topology_shows_the_pool_its_slots_and_pump_leaders(
    service: Service, deployment: Deployment
) -> None:
    await publish(service, "placed", 1)
    pool = service.pools["default"]
    leader = RedisPool.create(pool.settings, EngineConfig())
    await leader.start(run_pump=True, reconcile_every_s=0)
    try:
        assert leader.pump is not None
        for _ in range(100):  # the pump takes its 16 leases within a renewal period
            leads = await service.pump_leaders("default")
            if all(lead.holder for lead in leads):
                break
            await asyncio.sleep(0.05)
        (view,) = await service.topology()
    finally:
        await leader.close()
    topo = view.topology
    assert topo.kind == deployment.pool_settings().kind
    assert [lead.shard for lead in view.leaders] == list(range(16))
    assert {lead.holder for lead in view.leaders} == {leader.pump.token}
    assert all(0 < lead.ttl_ms <= 3_000 and lead.epoch >= 1 for lead in view.leaders)
    (placed,) = [p for p in view.queues if p.queue == "placed"]
    shard = shard_of(f"{NS}/placed", 16)
    assert (placed.namespace, placed.shard, placed.leader) == (NS, shard, leader.pump.token)
    assert view.leaders[shard].queues >= 1
    if isinstance(deployment, Cluster):
        assert len(topo.shards) == 3
        servers = {f"127.0.0.1:{s.port}" for s in deployment.servers}
        primaries = {s.primary for s in topo.shards}
        replicas = {r for s in topo.shards for r in s.replicas}  # those attached by now
        assert primaries <= servers and replicas <= servers - primaries
        covered = sum(hi - lo + 1 for s in topo.shards for lo, hi in s.slots)
        assert covered == 16384
        assert placed.slot == key_slot(QueueKeys(NS, "placed").meta.encode())
        owner = deployment.sync_client().get_node_from_key(QueueKeys(NS, "placed").meta)
        assert placed.node == f"{owner.host}:{owner.port}"
    elif isinstance(deployment, SentinelGroup):
        assert topo.master == f"127.0.0.1:{deployment.master_port()}"
        assert placed.slot is None and placed.node == topo.master
    else:
        assert topo.master == topo.addresses[0] and placed.node == topo.master


async def test_leaders_of_an_unknown_pool_are_not_found(service: Service) -> None:
    with pytest.raises(NotFound):
        await service.pump_leaders("nope")


# -- the pages, through a real `cluster-dq serve` ----------------------------------------------


@pytest.fixture
def clients(
    served: ServiceProcess, sync_redis: redis.Redis
) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """(the data API with a token of ``NS``, the dashboard with the admin account)."""
    token = httpx.post(
        f"{served.admin}/token/{NS}", params={"description": "panels"}, auth=ADMIN_AUTH
    ).json()["token"]
    with (
        httpx.Client(base_url=served.base, headers={"X-Token": token}, timeout=30) as api,
        httpx.Client(base_url=served.admin, auth=ADMIN_AUTH, timeout=30) as ui,
    ):
        yield api, ui


def csrf(ui: httpx.Client) -> str:
    ui.get("/ui/topology")  # any page sets the cookie
    return str(ui.cookies.get("dq_csrf"))


def test_the_timeline_page_drills_down_and_reschedules_a_bin(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    api, ui = clients
    jid = api.put(f"/api/{NS}/page", params={"delay": 7200}, content=b"x").json()["job_id"]
    due = id_due_ms_of_text(jid) or 0
    page = ui.get(f"/ui/timeline/{NS}/page")
    assert page.status_code == 200 and 'id="timeline-total">1<' in page.text
    (start, end) = [
        (int(s), int(e))
        for s, e in re.findall(r'data-start="(\d+)" data-end="(\d+)" data-count="1"', page.text)
    ][0]
    assert start <= due < end
    drill = ui.get(f"/ui/timeline/{NS}/page", params={"start": start, "end": end})
    assert f'data-job-id="{jid}"' in drill.text
    form = {"csrf": csrf(ui), "start": str(start), "end": str(end), "shift": "-3600"}
    assert (
        ui.post(f"/ui/timeline/{NS}/page/reschedule", data={**form, "csrf": "x"}).status_code == 403
    )
    r = ui.post(f"/ui/timeline/{NS}/page/reschedule", data=form)
    assert r.status_code == 303
    moved = ui.get(
        f"/ui/timeline/{NS}/page", params={"start": due - 3_600_000, "end": due - 3_599_999}
    )
    assert f'data-job-id="{jid}"' in moved.text
    assert (
        f'data-job-id="{jid}"'
        not in ui.get(f"/ui/timeline/{NS}/page", params={"start": start, "end": end}).text
    )
    assert "job.reschedule" in ui.get("/ui/audit").text
    for bad in ({"start": "x", "end": "1"}, {"start": "5", "end": "1"}):
        r = ui.get(f"/ui/timeline/{NS}/page", params=bad)
        assert r.status_code == 400 and "Traceback" not in r.text
    r = ui.post(f"/ui/timeline/{NS}/page/reschedule", data={**form, "shift": "soon"})
    assert r.status_code == 400
    assert ui.get("/ui/timeline/bad name/q").status_code in (400, 404)


def test_the_dead_letter_groups_page_redrives_a_group(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    api, ui = clients
    ids = [api.put(f"/api/{NS}/dead", content=b"x").json()["job_id"] for _ in range(3)]
    for jid, why in zip(ids, ["order 1 failed", "order 2 failed", "card expired"]):
        assert api.post(f"/api/{NS}/dead/job/{jid}/bury", params={"reason": why}).status_code == 200
    frag = ui.get(f"/ui/panels/deadgroups/{NS}/dead")
    assert frag.status_code == 200 and "order &lt;n&gt; failed" in frag.text
    gid = panels.group_id("buried", "order <n> failed")
    assert f'data-group="{gid}" data-reason="buried" data-count="2"' in frag.text
    r = ui.post(
        f"/ui/deadletter/{NS}/dead/groups/redrive",
        data={"csrf": csrf(ui), "group": gid, "tries": "2"},
    )
    assert r.status_code == 303
    states = [api.get(f"/api/{NS}/dead/job/{j}").json()["state"] for j in ids]
    assert states == ["ready", "ready", "dead"]
    assert "job.kick" in ui.get("/ui/audit").text
    r = ui.post(f"/ui/deadletter/{NS}/dead/groups/redrive", data={"csrf": csrf(ui), "group": "?"})
    assert r.status_code == 400


def test_the_charts_and_topology_pages(
    clients: tuple[httpx.Client, httpx.Client], deployment: Deployment
) -> None:
    api, ui = clients
    api.put(f"/api/{NS}/charts", content=b"x")
    frag = ui.get(f"/ui/panels/charts/{NS}/charts")
    assert frag.status_code == 200 and 'id="chart-lateness"' in frag.text
    assert "/ui/panels/charts/" in ui.get(f"/ui/queue/{NS}/charts").text  # the queue page loads it
    page = ui.get("/ui/topology")
    assert page.status_code == 200
    kind = deployment.pool_settings().kind
    assert f'data-kind="{kind}"' in page.text
    assert f'data-queue="{NS}/charts"' in page.text
    holders = re.findall(r'class="leader" data-shard="\d+" data-holder="([^"]*)"', page.text)
    assert len(holders) == 16
    if kind == "cluster":
        slot = key_slot(QueueKeys(NS, "charts").meta.encode())
        assert f'data-queue="{NS}/charts" data-slot="{slot}"' in page.text


def test_read_only_hides_and_refuses_the_panels_actions(redis_server: Server) -> None:
    """With DashboardReadOnly, the timeline and the groups offer no action, and an action sent
    anyway is a 403 that changes nothing. (One topology: the switch is the dashboard's own.)"""
    svc = serve(redis_server.pool_settings(), CLUSTER_DQ_DASHBOARDREADONLY="true")
    try:
        token = "ReadOnlyPanels" + uuid.uuid4().hex[:12]  # the read-only port makes none:
        with redis.Redis(port=redis_server.port) as r:  # as an earlier, writable run left it
            r.hset(AdminKeys.tokens("default", NS), token, "ro")
        with (
            httpx.Client(base_url=svc.base, headers={"X-Token": token}, timeout=30) as api,
            httpx.Client(base_url=svc.admin, auth=ADMIN_AUTH, timeout=30) as ui,
        ):
            jid = api.put(f"/api/{NS}/ro", params={"delay": 600}, content=b"x").json()["job_id"]
            dead = api.put(f"/api/{NS}/ro", content=b"x").json()["job_id"]
            api.post(f"/api/{NS}/ro/job/{dead}/bury", params={"reason": "no"})
            due = id_due_ms_of_text(jid) or 0
            page = ui.get(f"/ui/timeline/{NS}/ro", params={"start": due, "end": due + 1})
            assert f'data-job-id="{jid}"' in page.text and "bucket-shift" not in page.text
            assert "group-redrive" not in ui.get(f"/ui/panels/deadgroups/{NS}/ro").text
            token_ = csrf(ui)
            form = {"csrf": token_, "start": str(due), "end": str(due + 1), "to": "now"}
            assert ui.post(f"/ui/timeline/{NS}/ro/reschedule", data=form).status_code == 403
            gid = panels.group_id("buried", "no")
            r = ui.post(
                f"/ui/deadletter/{NS}/ro/groups/redrive", data={"csrf": token_, "group": gid}
            )
            assert r.status_code == 403
            states = [api.get(f"/api/{NS}/ro/job/{j}").json()["state"] for j in (jid, dead)]
            assert states == ["delayed", "dead"]
    finally:
        svc.stop(timeout=20)


def test_every_panel_refuses_an_unknown_pool(clients: tuple[httpx.Client, httpx.Client]) -> None:
    """The charts fragment ignored ``?pool=``: an unknown pool answered 200 (and a chart of
    the default pool's counters) where every other panel answers 404."""
    _, ui = clients
    for path in (
        f"/ui/panels/charts/{NS}/q",
        f"/ui/panels/deadgroups/{NS}/q",
        f"/ui/timeline/{NS}/q",
    ):
        r = ui.get(path, params={"pool": "no-such-pool"})
        assert r.status_code == 404 and "pool" in r.text, path


def _metrics_dir(svc: ServiceProcess) -> Path:
    """The prometheus multiprocess directory of this service's workers (their environment)."""
    for child in Path(f"/proc/{svc.proc.pid}/task/{svc.proc.pid}/children").read_text().split():
        env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        for kv in env:
            if kv.startswith(b"PROMETHEUS_MULTIPROC_DIR="):
                return Path(kv.split(b"=", 1)[1].decode())
    raise AssertionError("no worker with a metrics directory")


def test_the_charts_survive_an_unreadable_counter_file(redis_server: Server) -> None:
    """Workers sum their counters through files another worker may remove meanwhile (a dead
    worker's are): the charts read them with no guard, so an unreadable one (here a
    directory named like a counter file) made the fragment a 500. The overview's rates
    already skip such a read; the charts now do too (no new sample that time)."""
    svc = serve(redis_server.pool_settings())
    try:
        with httpx.Client(base_url=svc.admin, auth=ADMIN_AUTH, timeout=30) as ui:
            assert ui.get(f"/ui/panels/charts/{NS}/before").status_code == 200
            (_metrics_dir(svc) / "counter_unreadable.db").mkdir()
            for q in ("before", "after"):
                r = ui.get(f"/ui/panels/charts/{NS}/{q}")
                assert r.status_code == 200 and 'id="charts"' in r.text, (q, r.status_code)
    finally:
        svc.stop(timeout=20)


def test_jobs_due_past_the_last_bin_are_told_not_hidden(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    """60 bins of a year end 60 years out; a delay may be 136 years (2**32-1 s). Such a job was
    in the total and in no bin, and the page did not say where it was."""
    api, ui = clients
    for delay in (60, 2**32 - 1):
        r = api.put(f"/api/{NS}/far", params={"delay": delay, "ttl": 0}, content=b"x")
        assert r.status_code == 201
    page = ui.get(f"/ui/timeline/{NS}/far")
    assert page.status_code == 200 and 'id="timeline-total">2<' in page.text
    counts = [int(c) for c in re.findall(r'data-count="(\d+)"', page.text)]
    assert sum(counts) == 1
    assert re.search(r'id="timeline-outside">1 job\(s\) due after', page.text), page.text[:3000]
