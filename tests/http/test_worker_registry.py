"""Who is running what, against real Redis on every topology: a worker's announcement is
listed until it runs out or the worker retires; bad input is refused by name and changes
nothing; the registry is the namespace's (its token), bounded, and on one slot; a queue named
``workers`` keeps its lmstfy routes."""

from __future__ import annotations

import json
import time

import httpx
import redis

from cluster_dq.engine import workers as workers_ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.keys import WorkerKeys
from tests.support import ADMIN_AUTH

ANNOUNCEMENT = {
    "host": "web-3",
    "pid": 4242,
    "version": "0.1.0",
    "started_ms": 1795466600000,
    "queues": ["orders", "emails"],
    "concurrency": 16,
    "in_flight": [{"queue": "orders", "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM", "started_ms": 1}],
}


def listed(api: httpx.Client) -> list[dict[str, object]]:
    r = api.get("/api/ns/_workers")
    assert r.status_code == 200, r.text
    workers: list[dict[str, object]] = r.json()["workers"]
    return workers


def test_a_worker_is_listed_until_it_retires_or_runs_out(
    api: httpx.Client, sync_redis: redis.Redis
) -> None:
    assert listed(api) == []
    before = int(time.time() * 1000)
    r = api.put("/api/ns/_workers/w-1", json=ANNOUNCEMENT, params={"ttl": 30})
    assert r.status_code == 200, r.text
    assert r.json()["worker_id"] == "w-1" and r.json()["expires_ms"] >= before + 29_000
    (w,) = listed(api)
    assert {k: w[k] for k in ANNOUNCEMENT} == ANNOUNCEMENT
    assert w["worker_id"] == "w-1" and before <= int(str(w["last_seen_ms"])) <= time.time() * 1000
    # announced again: the latest announcement stands (what it holds changes)
    r = api.put("/api/ns/_workers/w-1", json={**ANNOUNCEMENT, "in_flight": []})
    assert r.status_code == 200 and listed(api)[0]["in_flight"] == []
    assert api.put("/api/ns/_workers/w-2", json={}, params={"ttl_ms": 300}).status_code == 200
    assert [w["worker_id"] for w in listed(api)] == ["w-1", "w-2"]
    time.sleep(0.5)  # w-2 ran out: a worker that died drops out on its own
    assert [w["worker_id"] for w in listed(api)] == ["w-1"]
    assert api.delete("/api/ns/_workers/w-1").status_code == 204
    assert listed(api) == []
    assert api.delete("/api/ns/_workers/w-1").status_code == 204  # again: nothing there
    api.put("/api/ns/_workers/w-3", json={}, params={"ttl_ms": 100})
    time.sleep(0.3)
    api.put("/api/ns/_workers/w-4", json={})  # drops the run-out entries from the index
    api.delete("/api/ns/_workers/w-4")
    left = [k for k in sync_redis.keys("*_workers*")]  # type: ignore[union-attr]
    assert left == [], left  # nothing left behind


def test_bad_announcements_are_refused_by_name_and_change_nothing(api: httpx.Client) -> None:
    assert api.put("/api/ns/_workers/keep", json=ANNOUNCEMENT).status_code == 200
    before = listed(api)
    many = [{"queue": "q", "job_id": f"j{i}"} for i in range(1_001)]
    bad = [
        ("/api/ns/_workers/w", {"json": {"colour": "red"}}, "colour"),
        ("/api/ns/_workers/w", {"json": {"pid": -1}}, "pid"),
        ("/api/ns/_workers/w", {"json": {"pid": True}}, "pid"),
        ("/api/ns/_workers/w", {"json": {"queues": ["_secret"]}}, "queues"),
        ("/api/ns/_workers/w", {"json": {"queues": "orders"}}, "queues"),
        ("/api/ns/_workers/w", {"json": {"in_flight": many}}, "in_flight"),
        ("/api/ns/_workers/w", {"json": {"in_flight": [{"queue": "q"}]}}, "in_flight"),
        ("/api/ns/_workers/w", {"json": {"host": "h" * 300}}, "host"),
        ("/api/ns/_workers/w", {"content": b'{"host": "\\ud800"}'}, "host"),  # a lone surrogate
        ("/api/ns/_workers/w", {"content": b'{"version": "\\udc00"}'}, "version"),
        ("/api/ns/_workers/w", {"content": b'{"queues": ["\\ud800"]}'}, "queues"),
        ("/api/ns/_workers/w", {"content": b'{"\\ud800": 1}'}, "unknown field"),
        ("/api/ns/_workers/w", {"json": {"host": "\x1b]0;owned\x07"}}, "host"),  # escapes
        ("/api/ns/_workers/w", {"json": {"version": "a\x9bb"}}, "version"),
        ("/api/ns/_workers/w", {"json": [1, 2]}, "announcement"),
        ("/api/ns/_workers/w", {"content": b"{nope"}, "announcement"),
        ("/api/ns/_workers/w", {"json": {}, "params": {"ttl": 0}}, "ttl"),
        ("/api/ns/_workers/w", {"json": {}, "params": {"ttl": 3_601}}, "ttl"),
        ("/api/ns/_workers/bad%20id", {"json": {}}, "worker id"),
        ("/api/ns/_workers/" + "x" * 65, {"json": {}}, "worker id"),
    ]
    for path, kwargs, name in bad:
        r = api.put(path, **kwargs)  # type: ignore[arg-type]
        assert r.status_code == 400, (path, kwargs, r.text)
        assert name in r.text, (name, r.text)
    r = api.put("/api/ns/_workers/w", content=b"{" + b" " * 300_000 + b"}")
    assert r.status_code == 413
    assert listed(api) == before  # nothing changed


def test_the_registry_is_the_namespaces_and_shadows_no_queue(
    api: httpx.Client, service: tuple[str, str]
) -> None:
    base, admin = service
    other = httpx.post(f"{admin}/token/other", params={"description": "o"}, auth=ADMIN_AUTH)
    token = other.json()["token"]
    assert api.put("/api/ns/_workers/w-1", json={}).status_code == 200
    with httpx.Client(base_url=base, headers={"X-Token": token}, timeout=30) as them:
        assert them.get("/api/ns/_workers").status_code == 401  # another namespace's token
        assert them.put("/api/other/_workers/w-9", json={}).status_code == 200
        assert [w["worker_id"] for w in them.get("/api/other/_workers").json()["workers"]] == [
            "w-9"
        ]
    assert httpx.get(f"{base}/api/ns/_workers").status_code == 401  # no token
    assert [w["worker_id"] for w in listed(api)] == ["w-1"]
    # a queue named "workers" keeps lmstfy's consume and publish
    assert api.put("/api/ns/workers", content=b"job").status_code == 201
    got = api.get("/api/ns/workers", params={"timeout": 0})
    assert got.status_code == 200 and got.json()["msg"] == "new job", got.text
    # and /api/ns/_workers/bulk is a worker named "bulk", not a bulk publish to "_workers"
    assert api.put("/api/ns/_workers/bulk", json={}).status_code == 200


async def test_a_namespace_holds_a_bounded_number_of_workers(engine: AsyncEngine) -> None:
    """The cap: a new worker past it is refused (nothing written); one already announced
    renews; one that ran out makes room."""
    now = engine.clock()
    run = engine.run
    assert await run(workers_ops.announce("cap", "a", b"{}", now, 60_000, 2))
    assert await run(workers_ops.announce("cap", "b", b"{}", now, 100, 2))
    assert not await run(workers_ops.announce("cap", "c", b"{}", now, 60_000, 2))
    assert await run(workers_ops.announce("cap", "a", b'{"x":1}', now, 60_000, 2))  # renews
    listed_now, cut = await run(workers_ops.workers("cap", now, 10, 10_000))
    assert sorted(w[0] for w in listed_now) == ["a", "b"] and not cut
    later = now + 200  # b ran out
    assert await run(workers_ops.announce("cap", "c", b"{}", later, 60_000, 2))
    found, _ = await run(workers_ops.workers("cap", later, 10, 10_000))
    assert sorted((i, json.loads(blob)) for i, _, blob in found) == [("a", {"x": 1}), ("c", {})]
    # a listing reads a chunk at a time up to its byte budget, and says when it stopped short
    part, cut = await run(workers_ops.workers("cap", later, 10, len(b'{"x":1}'), chunk=1))
    assert [i for i, _, _ in part] == ["a"] and cut
    keys = {WorkerKeys("cap").seen, WorkerKeys("cap").entry("a")}
    assert all("{cap/_workers}" in k for k in keys)  # one slot


def test_a_listing_counts_as_a_read_against_the_tokens_limit(
    api: httpx.Client, service: tuple[str, str]
) -> None:
    """A listing answers up to megabytes: a token limited to one read per interval lists
    once, then is told to wait (429), as for a consume; announcing is not a read."""
    token = api.headers["X-Token"]
    r = httpx.post(
        f"{service[1]}/token/ns/{token}/limit",
        json={"read": 1, "write": 0, "interval": 60},
        auth=ADMIN_AUTH,
    )
    assert r.status_code == 201, r.text
    assert api.put("/api/ns/_workers/w-1", json={}).status_code == 200
    # (each service process reads the limits within TokenCacheSecond: a few may pass first)
    codes = [api.get("/api/ns/_workers").status_code]
    until = time.monotonic() + 10
    while codes[-1] != 429:
        assert codes[-1] == 200 and time.monotonic() < until, codes
        time.sleep(0.1)
        codes.append(api.get("/api/ns/_workers").status_code)
    assert api.put("/api/ns/_workers/w-1", json={}).status_code == 200
