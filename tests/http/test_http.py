"""The lmstfy-compatible HTTP API, through real HTTP (a `cluster-dq serve` process) against a
real redis-server: every endpoint, lmstfy's shapes and status codes, and bad input for every
parameter (refused whole: nothing is written)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from cluster_dq.keys import QueueKeys, ShardKeys, shard_of
from cluster_dq.models import id_to_member
from cluster_dq.localredis import Server, free_port, start_server
from tests.support import ADMIN_AUTH, ROOT, serve, size


def test_publish_consume_ack_lmstfy_shapes(api: httpx.Client) -> None:
    r = api.put("/api/ns/q", params={"tries": 3, "ttl": 100}, content=b"hello \x00 bytes")
    assert r.status_code == 201 and r.headers["x-request-id"]
    body = r.json()
    assert body["msg"] == "published" and isinstance(body["job_id"], str)
    jid = body["job_id"]
    r = api.get("/api/ns/q", params={"ttr": 30})
    assert r.status_code == 200
    job = r.json()
    assert {k: job[k] for k in ("msg", "namespace", "queue", "job_id", "remain_tries")} == {
        "msg": "new job",
        "namespace": "ns",
        "queue": "q",
        "job_id": jid,
        "remain_tries": 2,
    }
    assert base64.b64decode(job["data"]) == b"hello \x00 bytes"
    assert isinstance(job["elapsed_ms"], int) and 0 <= job["elapsed_ms"] < 10_000
    assert 98 <= job["ttl"] <= 100 and job["attributes"] is None
    assert api.get("/api/ns/q").json() == {"msg": "no job available"}
    assert api.get("/api/ns/q").status_code == 404
    assert api.delete(f"/api/ns/q/job/{jid}").status_code == 204
    assert api.delete(f"/api/ns/q/job/{jid}").status_code == 204  # idempotent, as lmstfy
    assert size(api)["size"] == 0 and size(api)["reserved"] == 0


def test_a_delete_says_the_state_it_cancelled_the_job_in(api: httpx.Client) -> None:
    """DELETE …/job/{id} is lmstfy's 204 in every state; its X-Job-State header says which
    state the job was cancelled in, or `none` when there was no such job."""

    def publish(**query: Any) -> str:
        return str(api.put("/api/ns/cancel", params=query, content=b"x").json()["job_id"])

    ready, delayed, wheel = publish(), publish(delay_ms=2_000), publish(delay=3_600)
    reserved, dead = publish(), publish(job_id="cancel-dead")
    api.get("/api/ns/cancel", params={"ttr_ms": 60_000})  # takes the oldest ready: `ready`
    api.delete(f"/api/ns/cancel/job/{ready}")
    assert api.get("/api/ns/cancel", params={"ttr_ms": 60_000}).json()["job_id"] == reserved
    r = api.post(f"/api/ns/cancel/job/{dead}/bury", params={"reason": "x"})
    assert r.status_code == 200, r.text
    ready = publish()
    for jid, state in [
        (ready, "ready"),
        (delayed, "delayed"),
        (wheel, "delayed"),
        (reserved, "reserved"),
        (dead, "dead"),
        (dead, "none"),
    ]:
        r = api.delete(f"/api/ns/cancel/job/{jid}")
        assert (r.status_code, r.headers["x-job-state"], r.content) == (204, state, b""), jid


def test_ttl_zero_means_forever_and_delay_is_honoured(api: httpx.Client) -> None:
    jid = api.put("/api/ns/q", params={"ttl": 0, "delay_ms": 300}, content=b"x").json()["job_id"]
    assert api.get("/api/ns/q").status_code == 404  # not due yet
    peek = api.get(f"/api/ns/q/job/{jid}").json()
    assert peek["state"] == "delayed" and peek["ttl"] == 0
    time.sleep(0.35)
    job = api.get("/api/ns/q").json()
    assert job["job_id"] == jid and job["ttl"] == 0 and job["elapsed_ms"] >= 300


def test_bulk_publish_keeps_raw_json_elements(api: httpx.Client) -> None:
    raw = b'[ "hello", {"a": 1,  "b": [2]}, 3 ]'
    r = api.put("/api/ns/q/bulk", content=raw)
    assert r.status_code == 201
    ids = r.json()["job_ids"]
    got = api.get("/api/ns/q", params={"count": 10}).json()
    assert [j["job_id"] for j in got] == ids
    assert [base64.b64decode(j["data"]) for j in got] == [b'"hello"', b'{"a": 1,  "b": [2]}', b"3"]


@pytest.mark.parametrize(
    ("content", "status", "message"),
    [
        (b"{}", 400, "request body should be an array of objects"),
        (b"[1, 2", 400, "request body should be an array of objects"),
        (b"[]", 400, "no jobs"),
        (json.dumps(list(range(65))).encode(), 400, "too many jobs"),
        (b"not json", 400, "request body should be an array of objects"),
    ],
)
def test_bad_bulk_is_refused_whole(
    api: httpx.Client, content: bytes, status: int, message: str
) -> None:
    r = api.put("/api/ns/q/bulk", content=content)
    assert (r.status_code, r.json()) == (status, {"error": message})
    assert size(api)["size"] == 0


def test_bulk_of_64_is_accepted_and_65_changes_nothing(api: httpx.Client) -> None:
    assert (
        api.put("/api/ns/q/bulk", content=json.dumps(list(range(64))).encode()).status_code == 201
    )
    assert (
        api.put("/api/ns/q/bulk", content=json.dumps(list(range(65))).encode()).status_code == 400
    )
    assert size(api)["size"] == 64


def test_batch_and_multi_queue_consume(api: httpx.Client) -> None:
    api.put("/api/ns/low", content=b"l")
    api.put("/api/ns/high", content=b"h1")
    api.put("/api/ns/high", content=b"h2")
    one = api.get("/api/ns/low,high").json()
    assert base64.b64decode(one["data"]) == b"l"  # listed order is priority order
    many = api.get("/api/ns/high,low", params={"count": 5}).json()
    assert isinstance(many, list) and [base64.b64decode(j["data"]) for j in many] == [b"h1", b"h2"]
    api.put("/api/ns/high", content=b"h3")
    assert isinstance(api.get("/api/ns/high", params={"count": 2}).json(), list)


def test_batch_ack_acks_many_ids_in_any_state(api: httpx.Client) -> None:
    ready = api.put("/api/ns/q/bulk", content=b"[1, 2, 3, 4]").json()["job_ids"]
    later = api.put("/api/ns/q", params={"delay": 60}, content=b"d").json()["job_id"]
    taken = [j["job_id"] for j in api.get("/api/ns/q", params={"count": 3}).json()]
    unknown = "unknown-client-id"
    r = api.post("/api/ns/q/ack", json=[*taken, later, taken[0], unknown])
    assert (r.status_code, r.json()) == (200, {"msg": "acked", "acked": 4, "not_found": [unknown]})
    assert {k: size(api)[k] for k in ("size", "delayed", "reserved")} == {
        "size": 1,
        "delayed": 0,
        "reserved": 0,
    }
    r = api.post("/api/ns/q/ack", json={"job_ids": ready})  # the object form; 3 already gone
    assert r.json() == {"msg": "acked", "acked": 1, "not_found": taken}
    assert size(api)["size"] == 0


@pytest.mark.parametrize(
    ("content", "status", "message"),
    [
        (b"not json", 400, "request body should be a JSON array of job ids"),
        (b'{"ids": []}', 400, "request body should be a JSON array of job ids"),
        (b'["JID", 1]', 400, "request body should be a JSON array of job ids"),
        (
            b'[{"job_id": "JID", "leese": "x"}]',
            400,
            "unknown field 'leese' in an acked job; known: job_id, lease, result",
        ),
        (b"[]", 400, "no job ids"),
        (b'["JID", "bad id!"]', 400, "invalid job id"),
        (
            json.dumps(["JID"] + [f"id-{i}" for i in range(1000)]).encode(),
            400,
            "too many job ids (max 1000)",
        ),
        (b"[" + b" " * 1_200_000 + b"]", 413, "body too large"),  # ids, leases, results
    ],
)
def test_bad_batch_ack_is_refused_and_acks_nothing(
    api: httpx.Client, content: bytes, status: int, message: str
) -> None:
    jid = api.put("/api/ns/q", content=b"keep").json()["job_id"]
    r = api.post(
        "/api/ns/q/ack", content=content.replace(b"JID", jid.encode())
    )  # a good id among bad
    assert (r.status_code, r.json()) == (status, {"error": message})
    assert api.get(f"/api/ns/q/job/{jid}").status_code == 200
    assert api.get("/api/ns/q/ack").status_code == 405


def test_touch_extends_the_ttr_and_release_nacks(api: httpx.Client) -> None:
    jid = api.put("/api/ns/q", params={"tries": 2}, content=b"work").json()["job_id"]
    assert api.post(f"/api/ns/q/job/{jid}/touch").json() == {"error": "job is not reserved"}
    assert api.get("/api/ns/q", params={"ttr_ms": 600}).json()["job_id"] == jid
    r = api.post(f"/api/ns/q/job/{jid}/touch", params={"ttr": 30})
    assert (r.status_code, r.json()) == (200, {"msg": "touched", "job_id": jid, "ttr_ms": 30_000})
    time.sleep(0.9)  # past the first ttr: the touch kept the reservation
    assert api.get(f"/api/ns/q/job/{jid}").json()["state"] == "reserved"
    r = api.post(f"/api/ns/q/job/{jid}/release", params={"delay_ms": 400})
    assert (r.status_code, r.json()) == (
        200,
        {"msg": "released", "job_id": jid, "state": "delayed"},
    )
    assert api.get("/api/ns/q").status_code == 404  # not before its delay
    job = api.get("/api/ns/q", params={"timeout": 5}).json()
    assert (job["job_id"], job["remain_tries"], job["deliveries"]) == (
        jid,
        0,
        2,
    )  # the nack counted
    assert api.post(f"/api/ns/q/job/{jid}/release").json()["state"] == "dead"  # no tries left
    assert api.get("/api/ns/q/deadletter").json()["deadletter_head"] == jid
    r = api.post(f"/api/ns/q/job/{jid}/release")
    assert (r.status_code, r.json()) == (404, {"error": "job is not reserved"})


@pytest.mark.parametrize(
    ("action", "params", "message"),
    [
        ("touch", {"ttr": "x"}, "invalid ttr"),
        ("touch", {"ttr_ms": "0"}, "invalid ttr_ms"),
        ("release", {"delay": "-1"}, "invalid delay"),
        ("release", {"delay_ms": ""}, "invalid delay_ms"),
    ],
)
def test_bad_touch_and_release_change_nothing(
    api: httpx.Client, action: str, params: dict[str, str], message: str
) -> None:
    jid = api.put("/api/ns/q", content=b"x").json()["job_id"]
    api.get("/api/ns/q", params={"ttr": 60})
    r = api.post(f"/api/ns/q/job/{jid}/{action}", params=params)
    assert (r.status_code, r.json()) == (400, {"error": message})
    assert api.post("/api/ns/q/job/bad%20id/touch").json() == {"error": "invalid job id"}
    assert api.get(f"/api/ns/q/job/{jid}").json()["state"] == "reserved"


def test_long_poll_waits_and_times_out(api: httpx.Client) -> None:
    started = time.monotonic()
    r = api.get("/api/ns/q", params={"timeout": 1})
    assert r.status_code == 404 and time.monotonic() - started >= 0.9
    api.put("/api/ns/q", params={"delay_ms": 500}, content=b"later")
    r = api.get("/api/ns/q", params={"timeout": 5})
    assert r.status_code == 200 and base64.b64decode(r.json()["data"]) == b"later"


def test_republish_acks_the_old_job(api: httpx.Client) -> None:
    old = api.put("/api/ns/q", content=b"v1").json()["job_id"]
    api.get("/api/ns/q")
    r = api.put(f"/api/ns/q/job/{old}", content=b"v2")
    assert r.status_code == 201
    assert api.get(f"/api/ns/q/job/{old}").json() == {"error": "job not found"}
    assert base64.b64decode(api.get("/api/ns/q").json()["data"]) == b"v2"


def test_peeks(api: httpx.Client) -> None:
    assert (api.get("/api/ns/q/peek").status_code, api.get("/api/ns/q/peek").json()) == (
        404,
        {"error": "the queue is empty"},
    )
    jid = api.put("/api/ns/q", params={"tries": 2}, content=b"p").json()["job_id"]
    peek = api.get("/api/ns/q/peek").json()
    assert peek["job_id"] == jid and "msg" not in peek and peek["remain_tries"] == 2
    one = api.get(f"/api/ns/q/job/{jid}").json()
    assert one["remain_tries"] == 2 and one["state"] == "ready"  # lmstfy always said 0
    assert api.get("/api/ns/q/job/nope").status_code == 404


def test_attributes(api: httpx.Client) -> None:
    headers = {
        "Enable-Job-Version": "YES",
        "Job-Attr-Color": "red",
        "Job-Attr-" + "K" * 40: "v" * 200,
    }
    api.put("/api/ns/q", headers=headers, content=b"a")
    job = api.get("/api/ns/q").json()
    assert job["attributes"] == {"color": "red", "k" * 32: "v" * 128}
    too_many = {"Enable-Job-Version": "YES", **{f"Job-Attr-A{i}": "x" for i in range(17)}}
    r = api.put("/api/ns/q", headers=too_many, content=b"a")
    assert (r.status_code, r.json()) == (400, {"error": "too many attributes, cannot exceed 16"})
    api.put("/api/ns/q", headers={"Job-Attr-Color": "red"}, content=b"b")  # no Enable-Job-Version
    assert api.get("/api/ns/q").json()["attributes"] is None


def test_an_attribute_value_in_utf8_comes_back_as_sent(api: httpx.Client) -> None:
    """Header values reach the app as latin-1: "é" (two UTF-8 bytes) came back as "Ã©".
    (A value that is not UTF-8 is a 400: test_edges.py.)"""
    headers = [("Enable-Job-Version", "YES"), ("Job-Attr-City", "Zürich 東京".encode())]
    jid = api.put("/api/ns/q", headers=headers, content=b"a").json()["job_id"]
    job = api.get(f"/api/ns/q/job/{jid}").json()
    assert job["attributes"] == {"city": "Zürich 東京"}, job
    api.delete(f"/api/ns/q/job/{jid}")


def test_dead_letter_cycle_and_destroy(api: httpx.Client) -> None:
    for _ in range(3):
        api.put("/api/ns/q", params={"tries": 1}, content=b"d")
    api.get("/api/ns/q", params={"count": 3, "ttr_ms": 50})
    deadline = time.monotonic() + 5
    while size(api)["dead"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    info = api.get("/api/ns/q/deadletter").json()
    assert info["deadletter_size"] == 3 and info["deadletter_head"]
    assert api.get("/api/ns/q/deadletter/size").json() == {
        "namespace": "ns",
        "queue": "q",
        "size": 3,
    }
    assert api.put("/api/ns/q/deadletter", params={"limit": 2}).json() == {
        "msg": "respawned",
        "count": 2,
    }
    assert size(api)["size"] == 2
    assert api.delete("/api/ns/q/deadletter", params={"limit": 5}).status_code == 204
    assert api.get("/api/ns/q/deadletter").json()["deadletter_head"] == ""
    api.put("/api/ns/q", params={"delay": 600}, content=b"later")
    api.get("/api/ns/q")
    assert api.delete("/api/ns/q").status_code == 204  # every state, unlike lmstfy
    assert size(api) == {
        "namespace": "ns",
        "queue": "q",
        "size": 0,
        "delayed": 0,
        "reserved": 0,
        "dead": 0,
    }


@pytest.mark.parametrize(
    ("method", "path", "params", "message"),
    [
        ("PUT", "/api/ns/q", {"delay": "-1"}, "invalid delay"),
        ("PUT", "/api/ns/q", {"delay": ""}, "invalid delay"),
        ("PUT", "/api/ns/q", {"delay": str(2**32)}, "invalid delay"),
        ("PUT", "/api/ns/q", {"ttl": "x"}, "invalid ttl"),
        ("PUT", "/api/ns/q", {"tries": "70000"}, "invalid tries"),
        ("PUT", "/api/ns/q", {"tries": "0"}, "tries shouldn't be zero"),
        ("PUT", "/api/ns/q", {"ttl": "5", "delay": "10"}, "ttl must be longer than delay"),
        ("PUT", "/api/ns/q", {"delay_ms": "1.5"}, "invalid delay_ms"),
        ("PUT", "/api/ns/q", {"priority": "300"}, "invalid priority"),
        ("PUT", "/api/ns/q", {"job_id": "bad id!"}, "invalid job id"),
        ("PUT", "/api/ns/_q", {}, "queue name contains forbidden characters"),
        ("PUT", "/api/ns/q%21", {}, "queue name contains forbidden characters"),
        ("PUT", "/api/n%24s/q", {}, "namespace name contains forbidden characters"),
        ("PUT", "/api/ns/" + "q" * 256, {}, "namespace or queue name too long"),
        ("GET", "/api/ns/q", {"ttr": "-5"}, "invalid ttr"),
        ("GET", "/api/ns/q", {"timeout": "601"}, "invalid timeout"),
        ("GET", "/api/ns/q", {"count": "0"}, "invalid count"),
        ("GET", "/api/ns/q", {"count": "101"}, "invalid count"),
        ("GET", "/api/ns/,,", {}, "invalid queue name(s)"),
        ("PUT", "/api/ns/q/deadletter", {"limit": "0"}, "invalid limit"),
        ("PUT", "/api/ns/q/deadletter", {"ttl": "-1"}, "invalid ttl"),
        ("DELETE", "/api/ns/q/job/has%20space", {}, "invalid job id"),
    ],
)
def test_bad_parameters_are_refused_by_name_and_write_nothing(
    api: httpx.Client,
    sync_redis: redis.Redis,
    method: str,
    path: str,
    params: dict[str, str],
    message: str,
) -> None:
    before = sorted(sync_redis.keys("*{ns/*"))
    r = api.request(method, path, params=params, content=b"body")
    assert (r.status_code, r.json()) == (400, {"error": message})
    assert r.headers["x-request-id"]
    assert sorted(sync_redis.keys("*{ns/*")) == before == []
    assert not sync_redis.sismember(ShardKeys(shard_of("ns/q", 16)).queues, "ns/q")


# Every route that reads JSON from a request: (method, path, query, body, the parameter its
# 400 names); @JID@ is a reserved job's id, @LEASE@ its lease, @N@ the number JSON cannot carry.
JSON_ROUTES = {
    "progress": ("PUT", "/api/ns/q/job/@JID@/progress", {"lease": "@LEASE@"}, '{"done": @N@}', "progress"),
    "ack result": ("DELETE", "/api/ns/q/job/@JID@", {"result": "@N@"}, None, "result"),
    "ack result, lease": ("DELETE", "/api/ns/q/job/@JID@", {"result": "[@N@]", "lease": "@LEASE@"}, None, "result"),
    "batch ack": ("POST", "/api/ns/q/ack", {}, '[{"job_id": "@JID@", "result": @N@}]', "result"),
    "bulk": ("PUT", "/api/ns/q/bulk", {}, '[{"a": @N@}]', "body"),
    "schedule": ("PUT", "/api/ns/q/schedules/s", {}, '{"every_ms": @N@, "job": {"body": "x"}}', "every_ms"),
    "settings": ("PATCH", "/api/ns/q/settings", {}, '{"backoff": "fixed", "backoff_ms": 5, "backoff_jitter": @N@}', "backoff_jitter"),
    "bury": ("POST", "/api/ns/q/job/@JID@/bury", {"lease": "@LEASE@"}, '{"reason": @N@}', "reason"),
    "release": ("POST", "/api/ns/q/job/@JID@/release", {"lease": "@LEASE@"}, '{"error": @N@}', "error"),
    "limit": ("POST", "@ADMIN@/token/ns/@TOKEN@/limit", {}, '{"read": @N@, "write": 1, "interval": 1}', "read"),
    "limit, put": ("PUT", "@ADMIN@/token/ns/@TOKEN@/limit", {}, '{"read": 1, "write": @N@, "interval": 1}', "write"),
}  # fmt: skip


@pytest.mark.parametrize("number", ["1e999", "-1e999", "NaN", "-Infinity", "1" + "0" * 400])
@pytest.mark.parametrize("route", JSON_ROUTES)
def test_a_number_json_cannot_carry_is_a_400_naming_the_parameter_on_every_json_route(
    api: httpx.Client,
    admin: httpx.Client,
    service: tuple[str, str],
    sync_redis: redis.Redis,
    route: str,
    number: str,
) -> None:
    """``1e999`` was stored as ``Infinity`` (a progress, a result): peeking the job by id then
    answered 500. NaN and infinities are no JSON: refused where the service reads JSON, with
    nothing written; so is an integer beyond a double's range, which Python keeps exactly and
    a reader on doubles (a browser) takes for infinity."""
    method, path, query, body, name = JSON_ROUTES[route]
    jid = api.put("/api/ns/q", content=b"keep").json()["job_id"]
    got = api.get("/api/ns/q", params={"ttr": 60}).json()
    token = api.headers["x-token"]
    sub = {
        "@JID@": jid,
        "@LEASE@": got["lease"],
        "@TOKEN@": token,
        "@ADMIN@": service[1],
        "@N@": number,
    }

    def fill(text: str) -> str:
        for k, v in sub.items():
            text = text.replace(k, v)
        return text

    before = {k: sync_redis.dump(k) for k in sync_redis.keys("*{ns/*")}
    r = (admin if path.startswith("@ADMIN@") else api).request(
        method,
        fill(path),
        params={k: fill(v) for k, v in query.items()},
        content=None if body is None else fill(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400, (r.status_code, r.text)
    assert name in r.json()["error"], r.text
    assert {k: sync_redis.dump(k) for k in sync_redis.keys("*{ns/*")} == before
    assert admin.get(f"/token/ns/{token}/limit").status_code == 404
    peek = api.get(f"/api/ns/q/job/{jid}")
    assert peek.status_code == 200 and peek.json()["state"] == "reserved"
    assert "progress" not in peek.json()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/ns/q/bulk", '[1, {"x": 1, "x": 2}]'),
        ("/api/ns/q/bulk", '[1, "\\ud800"]'),
        ("/api/ns/q/bulk", '[{"k": ["\\udc00"]}]'),
        ("/api/ns/q/job/@JID@/progress", '{"note": "a\\ud83d"}'),
        ("/api/ns/q/job/@JID@/progress", '{"\\ud800": 1}'),
    ],
    ids=["bulk-key-twice", "bulk-surrogate", "bulk-nested-surrogate", "progress", "progress-key"],
)
def test_json_holding_a_key_twice_or_a_lone_surrogate_is_a_400(
    api: httpx.Client, sync_redis: redis.Redis, path: str, body: str
) -> None:
    """A bulk publish's elements were read without the strict rule's key check, and took a
    lone surrogate (no Unicode text), which a progress already refused; a pair, and an escaped
    backslash before ``ud800``, are text."""
    jid = api.put("/api/ns/q", content=b"keep").json()["job_id"]
    lease = api.get("/api/ns/q", params={"ttr": 60}).json()["lease"]
    url = path.replace("@JID@", jid)
    before = {k: sync_redis.dump(k) for k in sync_redis.keys("*{ns/*")}
    r = api.put(url, params={"lease": lease} if "@JID@" in path else {}, content=body.encode())
    assert r.status_code == 400, r.text
    assert {k: sync_redis.dump(k) for k in sync_redis.keys("*{ns/*")} == before
    fine = '["\\ud83d\\ude00", "\\\\ud800"]'
    assert api.put("/api/ns/q/bulk", content=fine.encode()).status_code == 201


@pytest.mark.parametrize(
    ("method", "path", "name", "value"),
    [
        ("DELETE", "/api/ns/q/job/@JID@", "result", "%22%FF%22"),
        ("DELETE", "/api/ns/q/job/@JID@", "result", "%22%ED%A0%80%22"),
        ("POST", "/api/ns/q/job/@JID@/bury", "reason", "%C0%AF"),
        ("POST", "/api/ns/q/job/@JID@/release", "error", "a%FFb"),
    ],
)
def test_a_query_value_that_is_not_utf8_is_a_400_naming_it_not_replaced(
    api: httpx.Client, sync_redis: redis.Redis, method: str, path: str, name: str, value: str
) -> None:
    """The query string was decoded with U+FFFD for bytes that are not UTF-8: an ack's
    ``result=%22%FF%22`` was a 204 storing ``"\ufffd"``, not the JSON sent (a body that is not
    UTF-8 is a 400), and a reason or error was changed as silently."""
    jid = api.put("/api/ns/q", content=b"keep").json()["job_id"]
    lease = api.get("/api/ns/q", params={"ttr": 60}).json()["lease"]
    before = {k: sync_redis.dump(k) for k in sync_redis.keys("*{ns/*")}
    r = api.request(method, path.replace("@JID@", jid) + f"?lease={lease}&{name}={value}")
    assert r.status_code == 400, (r.status_code, r.text)
    assert name in r.json()["error"], r.text
    assert {k: sync_redis.dump(k) for k in sync_redis.keys("*{ns/*")} == before
    assert api.get(f"/api/ns/q/job/{jid}").json()["state"] == "reserved"


def test_an_infinity_stored_before_the_rule_is_shown_not_a_500(
    api: httpx.Client, sync_redis: redis.Redis
) -> None:
    """A progress or result stored as ``Infinity`` (before non-finite numbers were refused)
    made peeking the job by id a 500: it is given as its text."""
    qk = QueueKeys("ns", "q")
    jid = api.put("/api/ns/q", content=b"x").json()["job_id"]
    api.get("/api/ns/q", params={"ttr": 60})
    sync_redis.hset(qk.notes, "p:".encode() + id_to_member(jid), b'{"p":Infinity}')
    r = api.get(f"/api/ns/q/job/{jid}")
    assert r.status_code == 200, r.text
    assert r.json()["progress"] == '{"p":Infinity}'
    done = api.put("/api/ns/q", content=b"y").json()["job_id"]
    assert api.delete(f"/api/ns/q/job/{done}", params={"result": "1"}).status_code == 204
    kept = sync_redis.hget(qk.results, id_to_member(done))
    assert kept is not None
    sync_redis.hset(qk.results, id_to_member(done), kept[:12] + b"NaN")
    r = api.get(f"/api/ns/q/job/{done}")
    assert r.status_code == 200, r.text
    assert r.json()["result"] == "NaN"


def test_body_limit_413_and_unknown_routes(api: httpx.Client) -> None:
    r = api.put("/api/ns/q", content=b"x" * (1024 * 1024 + 1))
    assert (r.status_code, r.json()) == (413, {"error": "body too large"})
    assert api.put("/api/ns/q", content=b"x" * (1024 * 1024)).status_code == 201
    r = api.get("/nope")
    assert (r.status_code, r.json()) == (404, {"error": "api not found"})
    assert api.post("/api/ns/q").status_code == 405


def test_tokens_auth_and_pools(service: tuple[str, str], admin: httpx.Client) -> None:
    base = service[0]
    assert httpx.get(f"{base}/api/ns/q").json() == {"error": "token not found"}
    assert httpx.get(f"{base}/api/ns/q/size").status_code == 401  # size needs a token too
    assert httpx.get(f"{base}/api/ns/q", headers={"X-Token": "wrong"}).json() == {
        "error": "invalid token"
    }
    assert httpx.get(f"{base}/api/ns/q", headers={"X-Token": "nopool:x"}).json() == {
        "error": "pool not found"
    }
    tok = admin.post("/token/ns", data={"description": "d", "token": "my-custom-token-0123456789"})
    assert tok.status_code == 201 and tok.json() == {"token": "my-custom-token-0123456789"}
    assert admin.post("/token/ns", params={"description": "d", "token": "short"}).json() == {
        "error": "the user token was too short"
    }
    assert admin.post("/token/ns", params={"token": "x" * 30}).json() == {
        "error": "invalid description"
    }
    assert "my-custom-token-0123456789" in admin.get("/token/ns").json()["tokens"]
    assert (
        httpx.put(f"{base}/api/ns/q", params={"token": "my-custom-token-0123456789"}).status_code
        == 201
    )
    other = httpx.put(f"{base}/api/other/q", params={"token": "my-custom-token-0123456789"})
    assert other.status_code == 401  # a token is valid for its namespace only
    assert admin.delete("/token/ns/my-custom-token-0123456789").status_code == 204
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if (
            httpx.put(
                f"{base}/api/ns/q", params={"token": "my-custom-token-0123456789"}
            ).status_code
            == 401
        ):
            break
        time.sleep(0.2)
    else:
        pytest.fail("a deleted token kept working")
    assert httpx.get(f"{service[1]}/token/ns").status_code == 401  # admin basic auth
    assert admin.get("/pools").json() == ["default"]
    assert admin.get("/version").json()["version"]
    assert admin.get("/readyz").json()["status"] == "ok"


def test_rate_limit_and_refund(api: httpx.Client, admin: httpx.Client) -> None:
    token = api.headers["X-Token"]
    r = admin.post(f"/token/ns/{token}/limit", json={"read": 0, "write": 2, "interval": 60})
    assert r.status_code == 201
    assert admin.get(f"/token/ns/{token}/limit").json() == {"read": 0, "write": 2, "interval": 60}
    time.sleep(1.2)  # limits are cached for TokenCacheSecond
    assert api.put("/api/ns/q", params={"delay": "x"}).status_code == 400  # refunded
    assert api.put("/api/ns/q").status_code == 201
    assert api.put("/api/ns/q").status_code == 201
    r = api.put("/api/ns/q")
    assert r.status_code == 429 and "produce reach the limit rate" in r.json()["msg"]
    assert api.get("/api/ns/q").status_code == 200  # reads are not limited
    assert any(x["token"] == token for x in admin.get("/limits").json())
    assert admin.delete(f"/token/ns/{token}/limit").json() == {"msg": "success"}


def test_info_lists_queues_and_accesslog_switch(api: httpx.Client, admin: httpx.Client) -> None:
    api.put("/api/ns/alpha", content=b"x")
    api.put("/api/ns/beta", params={"delay": 100}, content=b"x")
    assert admin.get("/info").json() == {"ns": ["alpha", "beta"]}
    for route in ("/info", "/draining"):  # a pool that does not exist: refused, not `{}`
        r = admin.get(route, params={"pool": "nope"})
        assert r.status_code == 400 and r.json()["error"] == "the pool was not exists", route
    assert admin.post("/accesslog", params={"status": "enable"}).json() == {"status": "enabled"}
    assert admin.post("/accesslog", params={"status": "off"}).status_code == 400
    assert admin.post("/accesslog", params={"status": "disable"}).json() == {"status": "disabled"}


def test_redis_down_gives_503_not_500(redis_server: Server) -> None:
    dead = free_port(19000, 19500)
    svc = serve(f"127.0.0.1:{dead}", CLUSTER_DQ_RETRYBUDGETSECOND="1")
    base, admin = svc.base, svc.admin
    try:
        # (after the retry budget, 1 s: a connection refused is repeated, nothing having been
        # sent)
        r = httpx.put(f"{base}/api/ns/q", headers={"X-Token": "t"}, content=b"x", timeout=30)
        assert r.status_code == 503 and "unavailable" in r.json()["error"]
        assert httpx.get(f"{admin}/readyz").status_code == 503
    finally:
        svc.stop(timeout=20)


def test_redis_lost_mid_flight_gives_503_on_every_route() -> None:
    """Redis dies after the token (with a rate limit) was cached: never a 500, on any route."""
    server = start_server(free_port(20000, 21000))  # a port no other test's server takes meanwhile
    svc = serve(f"127.0.0.1:{server.port}", CLUSTER_DQ_RETRYBUDGETSECOND="1")
    base, admin = svc.base, svc.admin
    try:
        tok = httpx.post(f"{admin}/token/ns", params={"description": "t"}, auth=ADMIN_AUTH).json()[
            "token"
        ]
        r = httpx.post(
            f"{admin}/token/ns/{tok}/limit",
            json={"read": 100, "write": 100, "interval": 1},
            auth=ADMIN_AUTH,
        )
        assert r.status_code == 201
        h = {"X-Token": tok}
        assert httpx.put(f"{base}/api/ns/q", headers=h, content=b"x").status_code == 201
        server.kill()
        time.sleep(2.2)  # token and limit caches expired: every route must reach Redis again
        # (a consume too: its rate limit is checked in Redis before it would wait for a job)
        calls = [
            ("PUT", "/api/ns/q"),
            ("PUT", "/api/ns/q/bulk"),
            ("GET", "/api/ns/q"),
            ("DELETE", "/api/ns/q/job/01M80ZSZ2200001GG6510Z4KSP"),
            ("GET", "/api/ns/q/size"),
            ("GET", "/api/ns/q/peek"),
            ("GET", "/api/ns/q/deadletter"),
        ]

        def call(method: str, path: str) -> tuple[str, str, httpx.Response]:
            content = b'["a"]' if path.endswith("bulk") else b"x" if method == "PUT" else None
            r = httpx.request(method, base + path, headers=h, content=content, timeout=30)
            return method, path, r

        # At once: each rides its retry budget (nothing could be sent) before the 503.
        with ThreadPoolExecutor(len(calls)) as pool:
            answers = list(pool.map(lambda c: call(*c), calls))
        for method, path, r in answers:
            assert r.status_code == 503, (method, path, r.status_code, r.text)
            assert "unavailable" in r.json()["error"]
    finally:
        svc.stop(timeout=20)
        server.kill()


def test_an_evicting_redis_is_refused() -> None:
    server = start_server(extra=["--maxmemory-policy", "allkeys-lru"])
    try:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "CLUSTER_DQ_POOL__DEFAULT__ADDR": f"127.0.0.1:{server.port}",
        }
        out = subprocess.run(
            [sys.executable, "-m", "cluster_dq.cli", "serve", "--port", "0", "--admin-port", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 2 and "maxmemory-policy is 'allkeys-lru'" in out.stderr
    finally:
        server.kill()
