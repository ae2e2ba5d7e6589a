"""Limits a token or a tenant cannot get around, through real HTTP against real Redis:

- a token at its write limit is refused (429) by every verb that changes a queue, not only by
  publish: operator verbs (kick, redrive, respawn, purge, bury, reschedule, destroy), queue
  settings, pause and resume, schedules; nothing changes. A token with a write limit cannot
  create or resume a schedule at all (a schedule publishes without asking the limit);
- one namespace's long-polls cannot take every waiting slot of a worker
  (``MaxWaitersPerNamespace``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from cluster_dq.keys import AdminKeys, QueueKeys
from cluster_dq.localredis import Server
from tests.support import Deployment
from tests.support import ADMIN_AUTH, listeners, serve

NS = "lim"


@pytest.fixture(scope="module")
def own_service(deployment: Deployment) -> Iterator[tuple[str, str]]:
    svc = serve(deployment.pool_settings(), CLUSTER_DQ_QUEUESETTINGSCACHESECOND="0")
    yield svc.base, svc.admin
    svc.stop(timeout=20)


def new_token(admin: str, ns: str = NS) -> str:
    r = httpx.post(f"{admin}/token/{ns}", params={"description": "t"}, auth=ADMIN_AUTH)
    assert r.status_code == 201, r.text
    return r.json()["token"]  # type: ignore[no-any-return]


def set_limit(admin: str, token: str, write: int, read: int = 0) -> None:
    r = httpx.post(
        f"{admin}/token/{NS}/{token}/limit",
        json={"read": read, "write": write, "interval": 3600},
        auth=ADMIN_AUTH,
    )
    assert r.status_code == 201, r.text
    # every instance rereads limits within TokenCacheSecond (1 s in the suite)
    time.sleep(1.2)


@pytest.fixture
def clients(
    own_service: tuple[str, str], sync_redis: redis.Redis
) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """(an operator's token without a limit, a producer's token with write limit 1/hour)."""
    base, admin = own_service
    free, limited = new_token(admin), new_token(admin)
    set_limit(admin, limited, write=1)
    with (
        httpx.Client(base_url=base, headers={"X-Token": free}, timeout=30) as op,
        httpx.Client(base_url=base, headers={"X-Token": limited}, timeout=30) as prod,
    ):
        yield op, prod


def snapshot(r: redis.Redis, q: str) -> dict[str, Any]:
    """What a queue holds that a verb could change (DUMP of each key)."""
    qk = QueueKeys(NS, q)
    keys = [qk.ready, qk.delayed, qk.reserved, qk.dead, qk.jobs, qk.conf, qk.notes, qk.schedules]
    return {k: r.dump(k) for k in keys}


# -- item 7: every verb that changes a queue counts as a write ------------------------------


def test_a_token_at_its_write_limit_gets_429_on_every_verb_that_changes_a_queue(
    clients: tuple[httpx.Client, httpx.Client], sync_redis: redis.Redis
) -> None:
    op, prod = clients
    q = uuid.uuid4().hex[:10]
    # The operator's token sets the queue up: a ready job, a dead job, a paused schedule.
    ready = op.put(f"/api/{NS}/{q}", params={"ttl": 0}, content=b"r").json()["job_id"]
    dead = op.put(f"/api/{NS}/{q}", params={"ttl": 0}, content=b"d").json()["job_id"]
    assert op.post(f"/api/{NS}/{q}/job/{dead}/bury").status_code == 200
    body = {"every_ms": 1000, "paused": True}
    assert op.put(f"/api/{NS}/{q}/schedules/s", json=body).status_code == 201
    # The producer spends its one write of the hour elsewhere.
    assert prod.put(f"/api/{NS}/spent", content=b"x").status_code == 201
    before = snapshot(sync_redis, q)
    verbs: list[tuple[str, str, dict[str, Any]]] = [
        ("PUT", f"/api/{NS}/{q}", {"content": b"x"}),  # publish (as before)
        ("PUT", f"/api/{NS}/{q}/bulk", {"content": b'["a"]'}),
        ("PUT", f"/api/{NS}/{q}/job/{ready}", {"content": b"x"}),  # republish
        ("PUT", f"/api/{NS}/{q}/schedules/s", {"json": body}),  # replace
        ("PUT", f"/api/{NS}/{q}/schedules/t", {"json": body}),  # create
        ("POST", f"/api/{NS}/{q}/schedules/s/resume", {}),
        ("POST", f"/api/{NS}/{q}/schedules/s/pause", {}),
        ("DELETE", f"/api/{NS}/{q}/schedules/s", {}),
        ("PATCH", f"/api/{NS}/{q}/settings", {"json": {"max_size": 5}}),
        ("PUT", f"/api/{NS}/{q}/settings", {"json": {"tries": 3}}),
        ("POST", f"/api/{NS}/{q}/pause", {}),
        ("POST", f"/api/{NS}/{q}/resume", {}),
        ("POST", f"/api/{NS}/{q}/deadletter/{dead}/kick", {}),
        ("POST", f"/api/{NS}/{q}/deadletter/redrive", {}),
        ("POST", f"/api/{NS}/{q}/deadletter/purge", {}),
        ("PUT", f"/api/{NS}/{q}/deadletter", {"params": {"limit": 10}}),  # respawn
        ("DELETE", f"/api/{NS}/{q}/deadletter", {"params": {"limit": 10}}),
        ("POST", f"/api/{NS}/{q}/job/{ready}/bury", {}),
        ("POST", f"/api/{NS}/{q}/job/{ready}/reschedule", {"params": {"delay": 60}}),
        ("DELETE", f"/api/{NS}/{q}", {}),  # destroy
    ]
    for method, path, kw in verbs:
        r = prod.request(method, path, **kw)
        assert r.status_code == 429, (method, path, r.status_code, r.text)
        assert "produce reach the limit rate" in r.json()["msg"], (method, path)
        assert snapshot(sync_redis, q) == before, (method, path)
    # Reads are not writes; and a consumer still finishes what it was given (a consume
    # counts as a read; ack, release, touch and progress act on its own delivery).
    assert prod.get(f"/api/{NS}/{q}/settings").status_code == 200
    assert prod.get(f"/api/{NS}/{q}/schedules/s").status_code == 200
    assert prod.get(f"/api/{NS}/{q}/deadletter/jobs").status_code == 200
    job = prod.get(f"/api/{NS}/{q}", params={"ttr": 30})
    assert job.status_code == 200 and job.json()["job_id"] == ready
    lease = job.headers["x-lease"]
    path = f"/api/{NS}/{q}/job/{ready}"
    assert prod.post(f"{path}/touch", params={"ttr": 30, "lease": lease}).status_code == 200
    assert prod.put(f"{path}/progress", params={"lease": lease}, content=b"1").status_code == 200
    assert prod.delete(path, params={"lease": lease}).status_code == 204
    # The operator's token is not limited: the same verbs work for it.
    assert op.post(f"/api/{NS}/{q}/deadletter/{dead}/kick").status_code == 200


def test_a_refused_or_failed_operator_verb_spends_no_write(
    clients: tuple[httpx.Client, httpx.Client], own_service: tuple[str, str]
) -> None:
    """As with a publish, only a verb that succeeds is counted: a bad request, or a kick of a
    job that is not dead, gives its unit back."""
    op, prod = clients
    q = uuid.uuid4().hex[:10]
    jid = op.put(f"/api/{NS}/{q}", content=b"x").json()["job_id"]
    assert prod.post(f"/api/{NS}/{q}/deadletter/{jid}/kick").status_code in (404, 409)
    assert prod.post(f"/api/{NS}/{q}/job/{jid}/reschedule").status_code == 400
    assert prod.patch(f"/api/{NS}/{q}/settings", json={"nope": 1}).status_code == 400
    # the one write of the hour is still there
    assert prod.post(f"/api/{NS}/{q}/job/{jid}/bury").status_code == 200
    assert prod.post(f"/api/{NS}/{q}/deadletter/{jid}/kick").status_code == 429


def test_a_token_with_a_write_limit_cannot_create_or_resume_a_schedule(
    clients: tuple[httpx.Client, httpx.Client], sync_redis: redis.Redis
) -> None:
    """A schedule publishes on its own, without asking any limit: one created by a token with
    a write limit would publish past it (a job a second, for ever). Such a token is refused
    (403) and nothing is written; it may still pause and delete schedules."""
    op, prod = clients
    q = uuid.uuid4().hex[:10]
    every = {"every_ms": 1000}
    r = prod.put(f"/api/{NS}/{q}/schedules/tick", json=every)
    assert r.status_code == 403 and "write limit" in r.json()["error"], r.text
    assert sync_redis.exists(QueueKeys(NS, q).schedules) == 0
    assert op.put(f"/api/{NS}/{q}/schedules/tick", json={**every, "paused": True}).status_code == (
        201
    )
    before = snapshot(sync_redis, q)
    r = prod.post(f"/api/{NS}/{q}/schedules/tick/resume")
    assert r.status_code == 403 and "write limit" in r.json()["error"], r.text
    assert snapshot(sync_redis, q) == before
    # refusals spent nothing: the one write of the hour deletes the schedule
    assert prod.delete(f"/api/{NS}/{q}/schedules/tick").status_code == 204
    assert sync_redis.exists(QueueKeys(NS, q).schedules) == 0


def test_a_failed_write_gives_its_unit_back_to_its_own_window_only(
    own_service: tuple[str, str], sync_redis: redis.Redis
) -> None:
    """A write that fails is refunded, but only to the window that counted it: one that
    fails after its window ended (a body sent slowly, then refused) gives nothing to the
    next window. Before, the refund took a unit off whatever counter was there then, so
    requests held open across windows bought writes past the limit."""
    base, admin = own_service
    token = new_token(admin)
    r = httpx.post(
        f"{admin}/token/{NS}/{token}/limit",
        json={"read": 0, "write": 1, "interval": 2},
        auth=ADMIN_AUTH,
    )
    assert r.status_code == 201, r.text
    time.sleep(1.2)  # every instance rereads limits within TokenCacheSecond
    q = uuid.uuid4().hex[:10]
    go_on = threading.Event()
    slow: list[int] = []

    def body() -> Iterator[bytes]:
        yield b'{"max_si'
        go_on.wait(30)
        yield b'ze": "not a number"}'

    def slow_patch() -> None:
        with httpx.Client(base_url=base, headers={"X-Token": token}, timeout=60) as c:
            slow.append(c.patch(f"/api/{NS}/{q}/settings", content=body()).status_code)

    with httpx.Client(base_url=base, headers={"X-Token": token}, timeout=30) as prod:
        # counted at once: the window's one write is in use while its body is awaited
        counter = AdminKeys.counter("default", NS, token, "w")
        t = threading.Thread(target=slow_patch)
        t.start()
        _wait_for(lambda: sync_redis.get(counter) == b"1", "the slow request counted")
        # a new window: its one write, then the slow request fails (a 400) in it
        _wait_for(lambda: not sync_redis.exists(counter), "the window's end", within=10)
        assert prod.put(f"/api/{NS}/{q}", content=b"a").status_code == 201
        go_on.set()
        t.join(timeout=30)
        assert slow == [400]
        assert prod.put(f"/api/{NS}/{q}", content=b"b").status_code == 429


def test_a_write_that_was_applied_but_answered_503_is_not_refunded(
    redis_server: Server, standalone_redis: redis.Redis
) -> None:
    """Only a request that changed nothing gives its unit back. A publish written on the master
    but not confirmed by a replica (WaitReplicas with none) answers 503 "may have been
    applied": it was written, so it is counted. Before, it was refunded: a token at its write
    limit published without end while replicas lagged."""
    svc = serve(
        redis_server.pool_settings(),
        CLUSTER_DQ_POOL__DEFAULT__WAITREPLICAS="1",
        CLUSTER_DQ_POOL__DEFAULT__WAITTIMEOUTMS="50",
    )
    try:
        token = new_token(svc.admin)
        set_limit(svc.admin, token, write=1)
        q = uuid.uuid4().hex[:10]
        with httpx.Client(base_url=svc.base, headers={"X-Token": token}, timeout=30) as prod:
            first = prod.put(f"/api/{NS}/{q}", content=b"a")
            assert first.status_code == 503, first.text
            assert standalone_redis.zcard(QueueKeys(NS, q).ready) == 1  # written all the same
            assert prod.put(f"/api/{NS}/{q}", content=b"b").status_code == 429
            assert standalone_redis.zcard(QueueKeys(NS, q).ready) == 1
    finally:
        svc.stop(timeout=30)


# -- item 8: each namespace its share of a worker's long-polls --------------------------------


def _wait_for(check: Callable[[], bool], what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def test_a_namespace_that_fills_its_share_of_long_polls_locks_no_other_out(
    redis_server: Server, standalone_redis: redis.Redis
) -> None:
    """Namespace A fills its share of the worker's long-polls (MaxWaitersPerNamespace): its next
    long-poll gets the 429 it got before when all MaxWaiters were taken, while namespace B's
    long-poll still waits and gets its job."""
    svc = serve(
        redis_server.pool_settings(),
        CLUSTER_DQ_MAXWAITERS="4",
        CLUSTER_DQ_MAXWAITERSPERNAMESPACE="2",
    )
    a, b = f"wa{uuid.uuid4().hex[:8]}", f"wb{uuid.uuid4().hex[:8]}"
    tokens = {ns: new_token(svc.admin, ns) for ns in (a, b)}
    answers: dict[str, int] = {}

    def poll(ns: str, q: str, timeout: int) -> None:
        with httpx.Client(base_url=svc.base, headers={"X-Token": tokens[ns]}, timeout=60) as api:
            r = api.get(f"/api/{ns}/{q}", params={"timeout": timeout})
            answers[f"{ns}/{q}"] = r.status_code

    hogs = [threading.Thread(target=poll, args=(a, f"idle{i}", 4)) for i in range(2)]
    try:
        for t in hogs:
            t.start()
        _wait_for(
            lambda: all(listeners(standalone_redis, a, f"idle{i}") for i in range(2)),
            "A's two long-polls waiting",
        )
        with httpx.Client(base_url=svc.base, headers={"X-Token": tokens[a]}, timeout=30) as api:
            r = api.get(f"/api/{a}/more", params={"timeout": 4})
            assert r.status_code == 429 and "waiting" in r.json()["msg"], r.text
            assert int(r.headers["retry-after"]) >= 1
        waiter = threading.Thread(target=poll, args=(b, "work", 20))
        waiter.start()
        _wait_for(lambda: listeners(standalone_redis, b, "work") > 0, "B's long-poll waiting")
        with httpx.Client(base_url=svc.base, headers={"X-Token": tokens[b]}, timeout=30) as api:
            assert api.put(f"/api/{b}/work", content=b"x").status_code == 201
        waiter.join(timeout=30)
        assert answers[f"{b}/work"] == 200  # waited, and got its job
        for t in hogs:
            t.join(timeout=30)
        assert answers[f"{a}/idle0"] == answers[f"{a}/idle1"] == 404
    finally:
        svc.stop(timeout=30)


def test_a_burst_of_long_polls_gets_no_more_than_its_share(
    redis_server: Server, standalone_redis: redis.Redis
) -> None:
    """Long-polls of one namespace sent all at once: the share is counted when each starts to
    wait, not only before its first look, so a burst cannot slip past it while the first looks
    are in flight. At most MaxWaitersPerNamespace of them wait; the others get 429."""
    svc = serve(
        redis_server.pool_settings(),
        CLUSTER_DQ_MAXWAITERS="100",
        CLUSTER_DQ_MAXWAITERSPERNAMESPACE="2",
    )
    ns = f"wc{uuid.uuid4().hex[:8]}"
    token = new_token(svc.admin, ns)
    n = 12
    start = threading.Barrier(n)
    answers: list[int] = []

    def poll(i: int) -> None:
        with httpx.Client(base_url=svc.base, headers={"X-Token": token}, timeout=60) as api:
            api.get(f"/api/{ns}/warm{i}", params={"timeout": 0})  # connected, token cached
            start.wait()
            answers.append(api.get(f"/api/{ns}/q{i}", params={"timeout": 3}).status_code)

    threads = [threading.Thread(target=poll, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(answers) == n
        assert answers.count(404) <= 2 and answers.count(429) >= n - 2, answers
    finally:
        svc.stop(timeout=30)
