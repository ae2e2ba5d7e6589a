# ruff: noqa: F811  (the HTTP fixtures are imported from test_http and used as arguments)
"""Hostile review of the leases / edges change: each test reproduces one finding against a
real Redis and a real `cluster-dq serve`, and fails on the code it was written against."""

from __future__ import annotations

import socket
import sys
import subprocess
import os


import httpx
import redis

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.models import JobSpec
from cluster_dq.localredis import Server
from cluster_dq.settings import PoolSettings
from cluster_dq.testing.invariants import check_queue
from tests.support.routing import start, token
from tests.support import ROOT
from tests.support import size


def consume(api: httpx.Client, q: str = "q", **params: object) -> httpx.Response:
    return api.get(f"/api/ns/{q}", params={"ttr_ms": 30_000, **params})


def test_head_on_deadletter_deletes_nothing(api: httpx.Client) -> None:
    """HEAD is a safe method (monitors, proxies, curl -I send it). Starlette answers HEAD on
    every GET route through the GET handler; the dead-letter handler treats every method but
    GET and PUT as DELETE, so HEAD /deadletter deletes dead letters."""
    jid = api.put("/api/ns/q", content=b"x").json()["job_id"]
    assert consume(api).status_code == 200
    assert api.post(f"/api/ns/q/job/{jid}/release").status_code == 200  # last try: dead
    assert size(api)["dead"] == 1
    r = api.head("/api/ns/q/deadletter", params={"limit": 10})
    assert size(api)["dead"] == 1, f"HEAD ({r.status_code}) deleted the dead letter"
    assert r.status_code in (200, 405)


def test_head_on_token_route_creates_no_token(
    service: tuple[str, str], admin: httpx.Client
) -> None:
    """The admin token route's handler treats every method but GET as POST (create)."""
    before = admin.get("/token/ns").json()["tokens"]
    r = admin.head("/token/ns", params={"description": "made-by-head"})
    after = admin.get("/token/ns").json()["tokens"]
    assert "made-by-head" not in after.values() and len(after) == len(before), (
        f"HEAD ({r.status_code}) created a token"
    )
    assert r.status_code in (200, 405)


def test_batch_ack_with_a_stale_and_the_good_lease_of_one_job_is_refused(api: httpx.Client) -> None:
    """A batch naming one job twice, once with a stale lease: the stale one must not be
    dropped silently (the outcome must not depend on the order of the two elements)."""
    jid = api.put("/api/ns/q", params={"tries": 2}, content=b"x").json()["job_id"]
    good = consume(api).json()["lease"]
    stale = "0" * 16
    r = api.post(
        "/api/ns/q/ack", json=[{"job_id": jid, "lease": good}, {"job_id": jid, "lease": stale}]
    )
    assert r.status_code in (400, 409), f"stale lease last: {r.status_code} {r.text}"  # refused
    assert size(api)["reserved"] == 1
    r = api.post(
        "/api/ns/q/ack", json=[{"job_id": jid, "lease": stale}, {"job_id": jid, "lease": good}]
    )
    assert r.status_code in (400, 409), f"stale lease first: {r.status_code} {r.text}"
    assert size(api)["reserved"] == 1


async def test_engine_consume_of_more_than_255_jobs_loses_none(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """consume.lua names the i-th lease of a call `prefix .. string.char(i)`: the 256th job of
    one call raises 'bad argument to char' after ZPOPMIN took it from READY and after 255
    reservations were written. The engine's consume does not bound count (only the HTTP layer
    does: 100), so a direct caller of the engine loses every job popped past the 255th:
    in JOBS, in no state, never delivered again."""
    now = now_ms()
    for _ in range(5):
        await engine.run(
            ops.publish(engine.config, "ns", "q", [JobSpec(b"x", ttl_ms=0) for _ in range(64)], now)
        )
    try:
        jobs = await engine.run(ops.consume(engine.config, "ns", ["q"], 30_000, 300, now))
    except Exception as e:  # noqa: BLE001  (what the caller saw, then what Redis holds)
        jobs = []
        print("consume raised", type(e).__name__, e)
    check_queue(sync_redis, "ns", "q")  # every job in exactly one state
    assert len(jobs) == 300


def test_leases_work_while_a_pool_migrates(pools: dict[str, PoolSettings]) -> None:
    """With ``MigrateTo`` a queue's reads are (old, new). touch and release try each pool in
    turn, but touch.lua / release.lua answer a lease on a job they do not hold as the
    conflict 'gone' (code 6), and ops.touch/ops.release raise Conflict at the first pool: a job
    delivered from the new pool can never be touched or released with its own lease (409
    'gone'), only without one. (ack.lua maps 'gone' to no conflict, so ack is not affected.)"""
    svc = start(
        {"default": pools["default"], "old": pools["old"], "new": pools["new"]},
        CLUSTER_DQ_POOL__OLD__MIGRATETO="new",
    )
    base, _admin = svc.base, svc.admin
    try:
        with httpx.Client(
            base_url=base, headers={"X-Token": token(_admin, "old")}, timeout=30
        ) as api:
            jid = api.put("/api/ns/q", params={"tries": 3}, content=b"x").json()["job_id"]  # -> new
            got = api.get("/api/ns/q", params={"ttr": 30}).json()
            assert got["job_id"] == jid
            r = api.post(f"/api/ns/q/job/{jid}/touch", params={"ttr": 60, "lease": got["lease"]})
            assert r.status_code == 200, r.text
            r = api.post(f"/api/ns/q/job/{jid}/release", params={"lease": got["lease"]})
            assert r.status_code == 200, r.text
    finally:
        svc.stop(timeout=20)


def test_republish_with_a_lease_works_for_a_job_of_the_drained_pool(
    pools: dict[str, PoolSettings],
) -> None:
    """republish runs on the write (new) pool only; with a lease, republish.lua's lease_check
    finds the old job gone there (it lives in the drained pool) and answers 409 'gone',
    although that delivery holds it: a consumer cannot republish with its lease during a
    migration (without a lease the service acks the old pool too)."""
    old = pools["old"]
    client = redis.Redis(port=int(old.Addr.split(":")[1]), db=old.DB)
    SyncEngine(client).run(
        ops.publish(EngineConfig(), "ns", "q", [JobSpec(body=b"old", tries=3)], now_ms())
    )
    client.close()
    svc = start(
        {"default": pools["default"], "old": old, "new": pools["new"]},
        CLUSTER_DQ_POOL__OLD__MIGRATETO="new",
    )
    base, _admin = svc.base, svc.admin
    try:
        with httpx.Client(
            base_url=base, headers={"X-Token": token(_admin, "old")}, timeout=30
        ) as api:
            got = api.get("/api/ns/q", params={"ttr": 30}).json()  # from the old pool
            r = api.put(
                f"/api/ns/q/job/{got['job_id']}", params={"lease": got["lease"]}, content=b"next"
            )
            assert r.status_code == 201, r.text
            assert api.get(f"/api/ns/q/job/{got['job_id']}").status_code == 404
    finally:
        svc.stop(timeout=20)


def test_a_configured_pool_name_the_token_shape_refuses(redis_server: Server) -> None:
    """Pool (and ring) names were not checked at start-up, but the data port refuses by shape
    every token whose pool part is not [-_A-Za-z0-9]{1,64}: a pool named 'east.1' started, its
    admin handed out tokens (201), and every one of them was a 401 on the data port. The
    settings now refuse such a name at start-up, naming the key."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CLUSTER_DQ_POOL__DEFAULT__ADDR": f"127.0.0.1:{redis_server.port}",
        "CLUSTER_DQ_POOL__EAST.1__ADDR": f"127.0.0.1:{redis_server.port}",
    }
    out = subprocess.run(
        [sys.executable, "-m", "cluster_dq.cli", "serve", "--port", "0", "--admin-port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Pool.east.1" in out.stderr, out.stderr


def test_consume_with_ttr_zero_gives_no_second_holder(api: httpx.Client) -> None:
    """touch refuses ttr < 1 and the settings bound TTRSecond to >= 1, but consume takes ttr=0:
    the job is reserved with its deadline at `now`, so the delivery's own lease holds nothing
    from the start (its ack is a 409) and a second consumer gets the same job at once: two
    holders (SPEC §2.4). lmstfy itself parses ttr=0 without complaint, so the fix may be a 400
    or a floor (e.g. the smallest ttr the API takes elsewhere); either passes this test."""
    jid = api.put("/api/ns/q", params={"tries": 3}, content=b"x").json()["job_id"]
    first = api.get("/api/ns/q", params={"ttr": 0})
    assert first.status_code in (200, 400), first.text
    if first.status_code == 200:
        second = api.get("/api/ns/q", params={"ttr": 30})
        assert second.status_code == 404, f"{jid} delivered twice at once: {second.text}"


def test_a_huge_request_line_is_refused_before_it_is_buffered(service: tuple[str, str]) -> None:
    """Bodies are no longer read before the token is checked, but the request line is not
    bounded at all: an unauthenticated 40 MB query string is buffered whole (worker RSS 45 ->
    86 MB, 4.4 s, growing faster than linearly: 1 MB 0.03 s, 10 MB 0.44 s) and answered 401.
    One MB of query is refused here (414, or 400/431) or the connection is closed."""
    port = int(service[0].rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(
                b"GET /api/ns/q?token=junk&x=" + b"a" * 1_000_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            head = sock.recv(64)
        except (BrokenPipeError, ConnectionResetError):
            return  # refused while still sending: not buffered
    status = int(head.split()[1]) if head else 0
    assert status in (0, 400, 414, 431), head


def test_deeply_nested_json_is_a_400_not_a_500(api: httpx.Client, admin: httpx.Client) -> None:
    """json's decoder recurses once per nesting level: a body of 5,000 '[' (10 kB, well
    within every body limit) raises RecursionError, which no handler maps: a 500 and a
    traceback in the log, from the bulk publish, the batch ack and the admin limit routes."""
    deep = b"[" * 5000 + b"]" * 5000
    tok = api.headers["X-Token"]
    calls = {
        "bulk": lambda: api.put("/api/ns/q/bulk", content=b"[" + deep + b"]"),
        "batch ack": lambda: api.post("/api/ns/q/ack", content=b"[" + deep + b"]"),
        "admin limit": lambda: admin.post(f"/token/ns/{tok}/limit", content=deep),
    }
    got: dict[str, object] = {}
    for name, call in calls.items():
        try:
            got[name] = call().status_code
        except httpx.TransportError as e:  # the worker dropped the connection
            got[name] = type(e).__name__
    assert got == {"bulk": 400, "batch ack": 400, "admin limit": 400}
    assert size(api)["size"] == 0


def test_a_409_batch_ack_changes_nothing_while_a_pool_migrates(
    pools: dict[str, PoolSettings],
) -> None:
    """service.ack runs ack.lua pool by pool (drained pool first). A batch whose good lease
    holds a job of the old pool and whose stale lease names a job of the new pool: the old
    pool acks its job, the new pool refuses, and the client gets a 409 saying 'nothing was
    changed', while one job is gone."""
    old = pools["old"]
    client = redis.Redis(port=int(old.Addr.split(":")[1]), db=old.DB)
    SyncEngine(client).run(
        ops.publish(EngineConfig(), "ns", "q", [JobSpec(body=b"old", tries=3)], now_ms())
    )
    client.close()
    svc = start(
        {"default": pools["default"], "old": old, "new": pools["new"]},
        CLUSTER_DQ_POOL__OLD__MIGRATETO="new",
    )
    base, _admin = svc.base, svc.admin
    try:
        with httpx.Client(
            base_url=base, headers={"X-Token": token(_admin, "old")}, timeout=30
        ) as api:
            api.put("/api/ns/q", params={"tries": 3}, content=b"new")  # -> the new pool
            a = api.get("/api/ns/q", params={"ttr": 30}).json()  # the old pool's job first
            b = api.get("/api/ns/q", params={"ttr": 30}).json()
            assert (a["data"], b["data"]) == ("b2xk", "bmV3")
            r = api.post(
                "/api/ns/q/ack",
                json=[
                    {"job_id": a["job_id"], "lease": a["lease"]},
                    {"job_id": b["job_id"], "lease": "0" * 16},
                ],
            )
            assert r.status_code == 409, r.text
            assert api.get(f"/api/ns/q/job/{a['job_id']}").status_code == 200, (
                f"409 said {r.json()['error']!r}"
            )
    finally:
        svc.stop(timeout=20)
