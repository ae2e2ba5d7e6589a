"""Routing: a token's pool name stands for one pool, a pool migrating to another (lmstfy's
``MigrateTo``), or a ring of pools over which a namespace's queues are spread by consistent
hashing. Placement is checked on its own, then end to end through a real service: the old pool
is a standalone Redis, the new pool (and a ring member) is the topology under test."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine import schedules as sched_ops
from cluster_dq.engine.commands import EngineConfig, Sizes
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.models import JobSpec
from cluster_dq.routing import PoolRoute
from cluster_dq.settings import PoolSettings
from tests.support import Deployment
from tests.support.routing import start, token

NAMES = {n: n for n in "abcde"}
QUEUES = [(f"ns{i % 7}", f"q{i}") for i in range(10_000)]


def placements(members: list[str], previous: list[str] | None = None) -> dict[tuple[str, str], str]:
    route = PoolRoute("r", NAMES, members, previous or [])
    return {(ns, q): route.place(ns, q).write for ns, q in QUEUES}


@pytest.mark.parametrize("before", [["a", "b", "c"], ["a", "b", "c", "d"]])
def test_adding_a_pool_moves_about_one_nth_of_the_queues(before: list[str]) -> None:
    after = [*before, "e"]
    old, new = placements(before), placements(after)
    moved = [k for k in QUEUES if old[k] != new[k]]
    share = len(moved) / len(QUEUES)
    assert abs(share - 1 / len(after)) < 0.05, share
    assert {new[k] for k in moved} == {"e"}  # queues only move to the new pool
    counts = Counter(new.values())
    assert all(abs(c / len(QUEUES) - 1 / len(after)) < 0.06 for c in counts.values()), counts


def test_placement_is_the_same_in_every_process() -> None:
    code = (
        "from cluster_dq.routing import PoolRoute; r = PoolRoute('r', {n: n for n in 'abc'}, "
        "['a', 'b', 'c']); print(''.join(r.place('ns', f'q{i}').write for i in range(200)))"
    )
    seen = {
        subprocess.check_output(
            [sys.executable, "-c", code], env={"PYTHONHASHSEED": seed}, text=True
        )
        for seed in ("1", "2")
    }
    route = PoolRoute("r", NAMES, ["a", "b", "c"])
    assert seen == {"".join(route.place("ns", f"q{i}").write for i in range(200)) + "\n"}


def test_migration_and_previous_members_are_read_first() -> None:
    migrating = PoolRoute("a", NAMES, ["a"], moves={"a": "b"})
    assert migrating.place("ns", "q") == migrating.place("ns", "other")
    assert (migrating.place("ns", "q").write, migrating.place("ns", "q").reads) == ("b", ("a", "b"))
    ring = PoolRoute("r", NAMES, ["a", "b", "c"], previous=["a", "b"], moves={"b": "d"})
    seen = Counter()
    for ns, q in QUEUES[:2000]:
        p = ring.place(ns, q)
        seen[p.reads] += 1
        assert p.reads[-1] == p.write and len(set(p.reads)) == len(p.reads)
    # unmoved: a stays a; b migrates to d; moved to c: drained from a (or b and its target d)
    assert set(seen) == {("a",), ("b", "d"), ("a", "c"), ("b", "d", "c")}, seen
    assert ring.pools() == ["a", "b", "c", "d"]
    groups = ring.groups("ns", [q for _, q in QUEUES[:50]])
    assert [pool for pool, _ in groups][-1] in ("c", "d") and {p for p, _ in groups} == {
        "a",
        "b",
        "c",
        "d",
    }


# -- end to end -------------------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def sized(pool: PoolSettings, deployment: Deployment, ns: str, q: str) -> Sizes:
    return on_pool(pool, deployment, ops.sizes(EngineConfig(), ns, q))


_engines: dict[tuple[str, int], SyncEngine] = {}  # (Addr, DB) -> on that pool, for one test


@pytest.fixture(autouse=True)
def _engines_closed() -> Iterator[None]:
    yield
    while _engines:
        _engines.popitem()[1].client.close()


def on_pool(pool: PoolSettings, deployment: Deployment, op: Any) -> Any:
    """One engine operation, run on ``pool`` directly (what it holds, not what the service
    says). A test's client of each pool is made once: a new Cluster or Sentinel client per
    call (discovery and connections every time) took seconds of the ring test."""
    key = (pool.Addr, pool.DB)
    if key not in _engines:
        _engines[key] = SyncEngine(
            deployment.sync_client()
            if pool.DB == 0
            else redis.Redis(port=int(pool.Addr.split(":")[1]), db=pool.DB)
        )
    return _engines[key].run(op)


def until(check: Callable[[], bool], what: str, within: float = 20.0) -> None:
    """Polls ``check`` until it holds; fails after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def drain(api: httpx.Client, queues: str, want: int, timeout: int = 0) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while len(got) < want:
        r = api.get(f"/api/ns/{queues}", params={"ttr": 30, "timeout": timeout})
        if r.status_code == 404:
            break
        assert r.status_code == 200, r.text
        got.append(r.json())
        assert api.delete(f"/api/ns/{got[-1]['queue']}/job/{got[-1]['job_id']}").status_code == 204
    return got


def test_migration_drains_the_old_pool_while_publishing_to_the_new(
    pools: dict[str, PoolSettings], deployment: Deployment
) -> None:
    old, new = pools["old"], pools["new"]
    svc = start({"default": pools["default"], "old": old})
    base, admin = svc.base, svc.admin
    try:
        tok = token(admin, "old")
        with httpx.Client(base_url=base, headers={"X-Token": tok}, timeout=30) as api:
            dies = api.put("/api/ns/q", params={"tries": 1}, content=b"old-dies").json()["job_id"]
            assert api.get("/api/ns/q", params={"ttr_ms": 200}).json()["job_id"] == dies  # -> dead
            before = [
                api.put("/api/ns/q", content=f"old-{i}".encode()).json()["job_id"]
                for i in range(10)
            ]
            # delayed past anything a loaded machine takes until the long-poll below, which
            # then brings it forward (a fixed 8 s came due early when the restart took 8.5 s)
            late = api.put("/api/ns/q", params={"delay": 3600}, content=b"old-late").json()[
                "job_id"
            ]
            held = api.get("/api/ns/q", params={"ttr": 60}).json()["job_id"]  # stays reserved
            assert held == before[0]
            api.put("/api/ns/idem", params={"job_id": "kept"}, content=b"old-kept")
            api.put("/api/ns/idem", params={"job_id": "done"}, content=b"old-done")
            assert api.delete("/api/ns/idem/job/done").status_code == 204
    finally:
        svc.stop(timeout=20)
    assert sized(old, deployment, "ns", "q").ready == 9

    svc = start(
        {"default": pools["default"], "old": old, "new": new}, CLUSTER_DQ_POOL__OLD__MIGRATETO="new"
    )
    base, admin = svc.base, svc.admin
    try:
        with httpx.Client(base_url=base, headers={"X-Token": tok}, timeout=30) as api:
            after = [
                api.put("/api/ns/q", content=f"new-{i}".encode()).json()["job_id"] for i in range(5)
            ]
            assert sized(new, deployment, "ns", "q").ready == 5  # new jobs land on the new pool
            assert sized(old, deployment, "ns", "q").ready == 9
            deadline = time.monotonic() + 10  # the old pool's pump moves the dying job
            while api.get("/api/ns/q/size").json()["dead"] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            s = api.get("/api/ns/q/size").json()  # sums both pools
            assert (s["size"], s["delayed"], s["reserved"], s["dead"]) == (14, 1, 1, 1), s
            assert api.get("/api/ns/q/deadletter").json()["deadletter_head"] == dies
            assert api.get(f"/api/ns/q/job/{held}").json()["state"] == "reserved"
            # client ids span the move: one the old pool holds, or acked there, is a duplicate
            for jid in ("kept", "done"):
                r = api.put("/api/ns/idem", params={"job_id": jid}, content=b"again")
                assert r.json() == {"msg": "published", "job_id": jid, "duplicate": True}
            assert (
                "duplicate"
                not in api.put("/api/ns/idem", params={"job_id": "fresh"}, content=b"n").json()
            )
            assert (
                sized(old, deployment, "ns", "idem").ready,
                sized(new, deployment, "ns", "idem").ready,
            ) == (1, 1)
            assert api.get("/api/ns/idem/job/kept").json()["data"] == _b64("old-kept")
            assert api.post("/api/ns/idem/ack", json=["kept", "fresh"]).json()["acked"] == 2
            draining = httpx.get(f"{admin}/draining", params={"pool": "old"}).json()
            assert draining == {
                "pool": "old",
                "done": False,
                "draining": {"old": {"ns/q": {"size": 9, "delayed": 1, "reserved": 1, "dead": 1}}},
            }
            assert httpx.get(f"{admin}/draining", params={"pool": "new"}).json()["done"] is True
            assert api.get("/api/ns/q/peek").json()["job_id"] == before[1]  # old pool first
            assert (
                api.post(f"/api/ns/q/job/{held}/touch", params={"ttr": 60}).status_code == 200
            )  # on the old pool
            assert api.delete(f"/api/ns/q/job/{held}").status_code == 204  # ack on the old pool
            assert api.get(f"/api/ns/q/job/{held}").status_code == 404
            first = api.get("/api/ns/q", params={"ttr": 30}).json()
            assert first["job_id"] == before[1]  # the old pool is drained first
            again = api.put(f"/api/ns/q/job/{first['job_id']}", content=b"again").json()["job_id"]
            assert sized(new, deployment, "ns", "q").ready == 6  # republished onto the new pool
            assert (
                api.get(f"/api/ns/q/job/{first['job_id']}").status_code == 404
            )  # acked on the old
            assert api.put("/api/ns/q/deadletter", params={"limit": 5}).json()["count"] == 1
            ids = [j["job_id"] for j in drain(api, "q", 100)]
            assert set(ids[:9]) == {*before[2:], dies} and set(ids[9:]) == {*after, again}
            assert len(ids) == 15
            # the delayed old job comes due while a consumer long-polls both pools
            r = api.post(f"/api/ns/q/job/{late}/reschedule", params={"delay_ms": 1500})
            assert r.status_code == 200, r.text
            r = api.get("/api/ns/q", params={"ttr": 30, "timeout": 10})
            assert r.status_code == 200 and r.json()["job_id"] == late, r.text
            assert api.delete(f"/api/ns/q/job/{late}").status_code == 204
            s = api.get("/api/ns/q/size").json()
            assert (s["size"], s["delayed"], s["reserved"], s["dead"]) == (0, 0, 0, 0)
            assert httpx.get(f"{admin}/draining", params={"pool": "old"}).json()["done"] is True
            # a long poll over both pools is woken by a publish (it goes to the new pool)
            timer = threading.Timer(0.5, lambda: api.put("/api/ns/q", content=b"wake"))
            timer.start()
            r = api.get("/api/ns/q", params={"ttr": 30, "timeout": 5})
            timer.join()
            assert r.status_code == 200 and r.json()["data"] == _b64("wake"), r.text
    finally:
        svc.stop(timeout=20)


def test_a_ring_spreads_queues_and_drains_moved_ones_after_a_pool_is_added(
    pools: dict[str, PoolSettings], deployment: Deployment
) -> None:
    ring = {k: pools[k] for k in ("default", "old", "b", "c")}
    queues = [f"r{i}" for i in range(30)]
    two = PoolRoute("big", {n: n for n in ring}, ["old", "b"])
    three = PoolRoute("big", {n: n for n in ring}, ["old", "b", "c"], previous=["old", "b"])
    svc = start(ring, CLUSTER_DQ_RING__BIG__POOLS="old,b")
    base, admin = svc.base, svc.admin
    try:
        tok = token(admin, "big")
        with httpx.Client(base_url=base, headers={"X-Token": tok}, timeout=30) as api:
            for q in queues:
                assert api.put(f"/api/ns/{q}", content=f"{q}-1".encode()).status_code == 201
            for q in queues:  # each queue is on the member its hash names, and only there
                where = {n for n in ("old", "b") if sized(ring[n], deployment, "ns", q).ready}
                assert where == {two.place("ns", q).write}, q
            assert set(Counter(two.place("ns", q).write for q in queues)) == {"old", "b"}
            # one consume over queues on both members, in the caller's priority order
            got = api.get(f"/api/ns/{','.join(queues[:6])}", params={"ttr": 30, "count": 6}).json()
            assert sorted(j["queue"] for j in got) == queues[:6]
            for j in got:
                assert (
                    api.put(f"/api/ns/{j['queue']}/job/{j['job_id']}", content=b"x").status_code
                    == 201
                )
            info = httpx.get(f"{admin}/info", params={"pool": "big"}).json()
            assert sorted(info["ns"]) == sorted(queues)
            # the namespace's listing spans the ring's members: each queue once, by name
            listed: list[dict[str, Any]] = []
            cursor = ""
            while True:
                page = api.get("/api/ns", params={"limit": 7, "cursor": cursor}).json()
                listed += page["queues"]
                cursor = page["cursor"]
                if not cursor:
                    break
            assert [x["queue"] for x in listed] == sorted(queues)
            assert sum(x["ready"] for x in listed) == len(queues)
    finally:
        svc.stop(timeout=20)

    svc = start(
        ring, CLUSTER_DQ_RING__BIG__POOLS="old,b,c", CLUSTER_DQ_RING__BIG__PREVIOUSPOOLS="old,b"
    )
    base, admin = svc.base, svc.admin
    try:
        with httpx.Client(base_url=base, headers={"X-Token": tok}, timeout=30) as api:
            moved = [q for q in queues if three.place("ns", q).write == "c"]
            assert 0 < len(moved) < len(queues) // 2
            for q in queues:
                assert api.put(f"/api/ns/{q}", content=f"{q}-2".encode()).status_code == 201
            for q in moved:
                assert sized(ring["c"], deployment, "ns", q).ready == 1
                assert api.get(f"/api/ns/{q}/size").json()["size"] == 2
            draining = httpx.get(f"{admin}/draining", params={"pool": "big"}).json()["draining"]
            assert sorted(qn for queues in draining.values() for qn in queues) == sorted(
                f"ns/{q}" for q in moved
            )
            assert all(
                two.place("ns", qn[3:]).write == pool for pool, qs in draining.items() for qn in qs
            )
            for q in queues:  # nothing lost; the job on the old member first
                first = "x" if q in queues[:6] else f"{q}-1"
                assert [j["data"] for j in drain(api, q, 3)] == [_b64(first), _b64(f"{q}-2")], q
            # a long poll over queues on different members is answered by the one that gets work
            a_q = next(q for q in queues if three.place("ns", q).write == "old")
            b_q = next(q for q in queues if three.place("ns", q).write == "b")
            timer = threading.Timer(0.5, lambda: api.put(f"/api/ns/{b_q}", content=b"late"))
            timer.start()
            r = api.get(f"/api/ns/{a_q},{b_q}", params={"ttr": 30, "timeout": 5, "count": 2})
            timer.join()
            assert r.status_code == 200 and [j["queue"] for j in r.json()] == [b_q], r.text
            assert api.delete(f"/api/ns/{b_q}/job/{r.json()[0]['job_id']}").status_code == 204
            for q in queues:
                s = api.get(f"/api/ns/{q}/size").json()
                assert (s["size"], s["reserved"]) == (0, 0), q
            assert httpx.get(f"{admin}/draining", params={"pool": "big"}).json() == {
                "pool": "big",
                "done": True,
                "draining": {},
            }
    finally:
        svc.stop(timeout=20)


def test_publish_and_consume_beside_the_engine(
    pools: dict[str, PoolSettings], deployment: Deployment
) -> None:
    """The spec the service writes is the engine's: a job put on the old pool by the engine
    (as the Spark pipeline does) is consumed through the migrating route."""
    old = pools["old"]
    client = redis.Redis(port=int(old.Addr.split(":")[1]), db=old.DB)
    SyncEngine(client).run(
        ops.publish(EngineConfig(), "ns", "bulk", [JobSpec(body=b"from-spark")], now_ms())
    )
    client.close()
    svc = start(
        {"default": pools["default"], "old": old, "new": pools["new"]},
        CLUSTER_DQ_POOL__OLD__MIGRATETO="new",
    )
    base, admin = svc.base, svc.admin
    try:
        with httpx.Client(
            base_url=base, headers={"X-Token": token(admin, "old")}, timeout=30
        ) as api:
            assert [j["data"] for j in drain(api, "bulk", 5)] == [_b64("from-spark")]
    finally:
        svc.stop(timeout=20)


def test_a_queues_settings_follow_it_to_the_pool_it_moves_to(
    pools: dict[str, PoolSettings], deployment: Deployment
) -> None:
    """A paused queue with a max size, default tries and a backoff, set while it lived on
    ``old``: once it migrates, the jobs written on ``new`` obey the same settings (its scripts
    read them there), even when no request reads the settings first."""
    old, new = pools["old"], pools["new"]
    settings = {
        "tries": 5,
        "max_size": 3,
        "backoff": "fixed",
        "backoff_ms": 2_000,
    }
    svc = start({"default": pools["default"], "old": old})
    try:
        tok = token(svc.admin, "old")
        with httpx.Client(base_url=svc.base, headers={"X-Token": tok}, timeout=30) as api:
            assert api.patch("/api/ns/moving/settings", json=settings).status_code == 200
            assert api.post("/api/ns/moving/pause").status_code == 200
    finally:
        svc.stop(timeout=20)

    svc = start(
        {"default": pools["default"], "old": old, "new": new}, CLUSTER_DQ_POOL__OLD__MIGRATETO="new"
    )
    try:
        with httpx.Client(base_url=svc.base, headers={"X-Token": tok}, timeout=30) as api:
            # tries given: the publish itself has no need of the queue's defaults
            first = api.put("/api/ns/moving", params={"tries": 2}, content=b"a")
            assert first.status_code == 201, first.text
            assert sized(new, deployment, "ns", "moving").ready == 1
            assert api.get("/api/ns/moving", params={"ttr": 30}).status_code == 404  # paused
            got = api.get("/api/ns/moving/settings").json()
            assert {k: got[k] for k in settings} == settings and got["paused"] is True
            assert api.post("/api/ns/moving/resume").status_code == 200
            second = api.put("/api/ns/moving", content=b"b").json()["job_id"]
            api.put("/api/ns/moving", content=b"c")
            full = api.put("/api/ns/moving", content=b"d")
            assert full.status_code == 429, full.text  # max_size 3, on the new pool
            job = api.get(f"/api/ns/moving/job/{second}").json()
            assert job["remain_tries"] == 5  # the queue's default tries
            consumed = api.get("/api/ns/moving", params={"ttr": 30}).json()
            r = api.post(f"/api/ns/moving/job/{consumed['job_id']}/release")
            assert r.status_code == 200 and r.json()["state"] == "delayed", r.text  # the backoff
    finally:
        svc.stop(timeout=20)


def test_a_queues_schedules_move_with_it_and_fire_once_per_occurrence(
    pools: dict[str, PoolSettings], deployment: Deployment
) -> None:
    """A queue with a schedule firing every second, a paused one and settings, on ``old``;
    then ``old`` migrates to ``new``. With no request for the queue, the migrating pool's
    firer moves the firing schedule (and the settings with it) to ``new``, where it goes on;
    a request for the queue's schedules brings the paused one over. Every occurrence from the
    first on is published exactly once over both pools: none twice, none missed, although
    both pools' firers run."""
    old, new = pools["old"], pools["new"]
    every = {"every_ms": 1_000, "job": {"body": "tick"}}
    settings = {"tries": 4, "max_size": 1_000}
    svc = start({"default": pools["default"], "old": old})
    try:
        tok = token(svc.admin, "old")
        with httpx.Client(base_url=svc.base, headers={"X-Token": tok}, timeout=30) as api:
            assert api.patch("/api/ns/sched/settings", json=settings).status_code == 200
            r = api.put("/api/ns/sched/schedules/tick", json=every)
            assert r.status_code == 201, r.text
            r = api.put("/api/ns/sched/schedules/idle", json={**every, "paused": True})
            assert r.status_code == 201, r.text
            # a few occurrences fired on old
            until(lambda: sized(old, deployment, "ns", "sched").ready >= 2, "two on old")
    finally:
        svc.stop(timeout=20)
    assert sized(old, deployment, "ns", "sched").ready >= 2

    svc = start(
        {"default": pools["default"], "old": old, "new": new}, CLUSTER_DQ_POOL__OLD__MIGRATETO="new"
    )
    try:
        deadline = time.monotonic() + 20
        while on_pool(new, deployment, sched_ops.get("ns", "sched", "tick")) is None:
            assert time.monotonic() < deadline, "the schedule never reached the new pool"
            time.sleep(0.2)

        def gone_from_old() -> bool:
            # the move puts it on new, then removes it from old; between the two, the copy
            # left on old is marked moving, so it does not fire there
            left = on_pool(old, deployment, sched_ops.get("ns", "sched", "tick"))
            assert left is None or sched_ops.is_moving(left[1]), left
            return left is None

        until(gone_from_old, "the schedule left the old pool")
        got = on_pool(new, deployment, ops.queue_settings("ns", "sched")).as_json()
        assert {k: got[k] for k in settings} == settings  # carried with the schedule
        # occurrences fire on new: those the outage missed (caught up at once) and one due
        # after the schedule was seen there, published; six in all over both pools
        moved_at = now_ms()

        def fired_on_new() -> bool:
            _, state = on_pool(new, deployment, sched_ops.get("ns", "sched", "tick"))
            on_new = sized(new, deployment, "ns", "sched").ready
            on_old = sized(old, deployment, "ns", "sched").ready
            live = state.next_ms > moved_at + 1_000 and not state.flying
            return live and on_new >= 2 and on_old + on_new >= 6

        until(fired_on_new, "occurrences fired on the new pool")
        with httpx.Client(base_url=svc.base, headers={"X-Token": tok}, timeout=30) as api:
            listed = api.get("/api/ns/sched/schedules").json()["schedules"]
            assert {(s["name"], s["paused"]) for s in listed} == {("tick", False), ("idle", True)}
            assert on_pool(old, deployment, sched_ops.page("ns", "sched", 0, 100))[1] == []
            assert sized(new, deployment, "ns", "sched").ready >= 2
            jobs = drain(api, "sched", 1_000)
    finally:
        svc.stop(timeout=20)
    ids = [j["job_id"] for j in jobs]
    assert len(ids) == len(set(ids)), Counter(ids).most_common(3)  # none fired twice
    times = sorted(int(i.rsplit("-", 1)[1]) for i in ids)
    assert len(times) >= 6
    assert [b - a for a, b in zip(times, times[1:])] == [1_000] * (len(times) - 1)  # none missed
