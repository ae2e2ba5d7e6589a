"""Job progress and results, over the data app's HTTP API (in-process, the service's clock
under the test's control) against real Redis on every topology: progress is recorded only for
the delivery that holds the job (or, without a lease, a running reservation) and leaves with
the job's record; a result given on ack is shown by peek for ``ResultSecond``, then trimmed
from Redis; an ack without a result is lmstfy's, unchanged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.errors import BadRequest, BodyTooLarge
from cluster_dq.http import params
from cluster_dq.http.app import create_data_app
from cluster_dq.http.middleware import AccessLog
from cluster_dq.keys import QueueKeys
from cluster_dq.models import MAX_NOTE_BYTES, id_to_member
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import load
from tests.support import Deployment
from cluster_dq.testing.invariants import check_queue
from tests.support.run import examples

TOKEN = "progress-token-0123456789"
KEEP_S = 600  # ResultSecond of these tests
QK = QueueKeys("ns", "q")


class Clock:
    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


@dataclass
class DQ:
    api: httpx.AsyncClient
    service: Service
    clock: Clock
    r: redis.Redis

    async def publish(self, **query: Any) -> str:
        r = await self.api.put("/api/ns/q", params=query, content=b"x")
        assert r.status_code == 201, r.text
        return str(r.json()["job_id"])

    async def consume(self, ttr_ms: int = 30_000, **query: Any) -> dict[str, Any]:
        r = await self.api.get("/api/ns/q", params={"ttr_ms": ttr_ms, **query})
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    async def progress(self, jid: str, body: Any, **query: Any) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await self.api.put(f"/api/ns/q/job/{jid}/progress", params=query, content=content)

    async def peek(self, jid: str) -> httpx.Response:
        return await self.api.get(f"/api/ns/q/job/{jid}")

    async def tick(self) -> None:
        engine = self.service.pools["default"].engine
        await engine.run(ops.tick(engine.config, "ns", "q", self.clock()))

    def notes(self) -> dict[bytes, bytes]:
        return self.r.hgetall(QK.notes)  # type: ignore[return-value]


@pytest.fixture
async def dq(deployment: Deployment, sync_redis: redis.Redis) -> AsyncIterator[DQ]:
    ps = deployment.pool_settings()
    env = {"CLUSTER_DQ_POOL__DEFAULT__ADDR": ps.Addr, "CLUSTER_DQ_RESULTSECOND": str(KEEP_S)}
    if ps.Cluster:
        env["CLUSTER_DQ_POOL__DEFAULT__CLUSTER"] = "true"
    if ps.MasterName:
        env["CLUSTER_DQ_POOL__DEFAULT__MASTERNAME"] = ps.MasterName
    s = load(None, env)
    pool = RedisPool.create(s.Pool["default"], EngineConfig.from_settings(s))
    clock = Clock(now_ms())
    pool.engine.clock = clock
    await pool.start(run_pump=False)
    service = Service(s, {"default": pool})
    await service.create_token("default", "ns", "test", TOKEN)
    app = create_data_app(service, s, AccessLog(False))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://dq", headers={"X-Token": TOKEN}
    ) as api:
        yield DQ(api, service, clock, sync_redis)
    await pool.close()


# -- progress ---------------------------------------------------------------------------------


async def test_progress_with_the_holding_lease_is_recorded_replaced_and_shown(dq: DQ) -> None:
    jid = await dq.publish()
    lease = (await dq.consume())["lease"]
    r = await dq.progress(jid, {"step": 1, "of": 3}, lease=lease)
    assert r.status_code == 200
    assert r.json() == {"msg": "progress saved", "job_id": jid, "state": "reserved"}
    r = await dq.progress(jid, {"step": 2, "of": 3, "note": "héllo"}, lease=lease)
    assert r.status_code == 200
    job = (await dq.peek(jid)).json()
    assert job["state"] == "reserved"
    assert job["progress"] == {"step": 2, "of": 3, "note": "héllo"}
    stored = dq.notes()[b"p:" + id_to_member(jid)]
    assert stored == '{"step":2,"of":3,"note":"héllo"}'.encode()  # compact, replaced
    # without a lease: any running reservation takes it (lmstfy-style clients)
    assert (await dq.progress(jid, [1, 2])).status_code == 200
    assert (await dq.peek(jid)).json()["progress"] == [1, 2]
    check_queue(dq.r, "ns", "q")


async def test_a_stale_lease_is_409_and_changes_nothing(dq: DQ) -> None:
    jid = await dq.publish(tries=3)
    first = (await dq.consume(ttr_ms=1_000))["lease"]
    assert (await dq.progress(jid, "a", lease=first)).status_code == 200
    dq.clock.t += 1_500  # the first delivery's ttr runs out
    r = await dq.progress(jid, "late", lease=first)
    assert r.status_code == 409 and r.json()["state"] == "ttr_expired"
    second = await dq.consume()
    assert second["job_id"] == jid and second["lease"] != first
    r = await dq.progress(jid, "late again", lease=first)
    assert r.status_code == 409
    assert r.json()["job_id"] == jid and r.json()["state"] == "reserved"  # another delivery's
    assert (await dq.peek(jid)).json()["progress"] == "a"  # the progress survives a redelivery
    assert (await dq.progress(jid, "b", lease=second["lease"])).status_code == 200
    assert (await dq.peek(jid)).json()["progress"] == "b"
    check_queue(dq.r, "ns", "q")


async def test_progress_of_a_job_that_is_not_reserved_is_409_or_404(dq: DQ) -> None:
    ready = await dq.publish()
    near = await dq.publish(delay_ms=2_000)
    wheel = await dq.publish(delay=3_600)  # rests in a wheel bucket
    cases = {ready: "ready", near: "delayed", wheel: "delayed"}
    for jid, state in cases.items():
        for query in ({}, {"lease": "0123456789abcdef"}):
            r = await dq.progress(jid, {"step": 1}, **query)
            assert r.status_code == 409, (state, query, r.text)
            assert r.json()["state"] == state and r.json()["job_id"] == jid
    missing = "01M84CMJGD0005J92T828HTERV"
    r = await dq.progress(missing, 1)
    assert r.status_code == 404 and r.json() == {"error": "job not found"}
    r = await dq.progress(missing, 1, lease="0123456789abcdef")
    assert r.status_code == 409 and r.json()["state"] is None
    # a dead job
    dead = await dq.publish(job_id="dies")
    await dq.api.delete(f"/api/ns/q/job/{ready}")
    await dq.consume(ttr_ms=100)
    dq.clock.t += 200
    await dq.tick()
    assert (await dq.peek(dead)).json()["state"] == "dead"
    r = await dq.progress(dead, 1)
    assert r.status_code == 409 and r.json()["state"] == "dead"
    # a reservation whose ttr ran out (the pump has not moved it yet) is not running
    late = await dq.publish(job_id="late", tries=2)
    await dq.consume(ttr_ms=100)
    dq.clock.t += 200
    r = await dq.progress(late, 1)
    assert r.status_code == 409 and r.json()["state"] == "ttr_expired"
    # nothing written by any refusal: the only note is the dead job's death (its field, no p:)
    assert list(dq.notes()) == [b"dies"]
    check_queue(dq.r, "ns", "q")


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"x" * (MAX_NOTE_BYTES + 1), 413),
        (json.dumps("y" * MAX_NOTE_BYTES).encode(), 413),
        (b"not json", 400),
        (b"", 400),
        (b"NaN", 400),
        (b'{"a": 1', 400),
        (b"\xff\xfe", 400),
        (b"[" * 100_000 + b"]" * 100_000, 413),
    ],
)
async def test_bad_or_too_big_progress_is_refused_and_changes_nothing(
    dq: DQ, body: bytes, status: int
) -> None:
    jid = await dq.publish()
    lease = (await dq.consume())["lease"]
    assert (await dq.progress(jid, {"kept": True}, lease=lease)).status_code == 200
    r = await dq.progress(jid, body, lease=lease)
    assert r.status_code == status, r.text
    assert "progress" in r.json()["error"]
    assert (await dq.peek(jid)).json()["progress"] == {"kept": True}


async def test_progress_of_the_largest_size_is_accepted(dq: DQ) -> None:
    jid = await dq.publish()
    await dq.consume()
    big = "z" * (MAX_NOTE_BYTES - 2)  # with its quotes: exactly the limit
    assert (await dq.progress(jid, big)).status_code == 200
    assert (await dq.peek(jid)).json()["progress"] == big


async def test_progress_leaves_with_the_job(dq: DQ) -> None:
    """Ack, ttl expiry, dead-letter delete, destroy: no notes field outlives its job."""
    acked = await dq.publish()
    expiring = await dq.publish(ttl=5)
    dying = await dq.publish(job_id="dying")
    kept = await dq.publish(ttl=0)
    got = (await dq.api.get("/api/ns/q", params={"ttr_ms": 1_000, "count": 4})).json()
    assert {j["job_id"] for j in got} == {acked, expiring, dying, kept}
    for j in got:
        assert (await dq.progress(j["job_id"], {"id": j["job_id"]}, lease=j["lease"])).is_success
    assert len(dq.notes()) == 4
    assert (await dq.api.delete(f"/api/ns/q/job/{acked}")).status_code == 204
    assert len(dq.notes()) == 3
    check_queue(dq.r, "ns", "q")
    dq.clock.t += 1_500  # every ttr runs out: tries 1, so all three go dead
    await dq.tick()
    assert (await dq.peek(dying)).json()["state"] == "dead"
    assert (await dq.peek(dying)).json()["progress"] == {"id": dying}  # a dead job keeps it
    # respawn the dead letter, let the 5-s ttl of one end, delete the rest of the dead
    await dq.api.put("/api/ns/q/deadletter", params={"limit": 3, "ttl": 5})
    dq.clock.t += 6_000
    await dq.tick()
    check_queue(dq.r, "ns", "q")
    assert len(dq.notes()) == 0  # the respawned jobs (ttl 5 s) expired with their progress
    again = await dq.publish(job_id="again", ttl=0)
    await dq.consume(ttr_ms=100)
    assert (await dq.progress(again, 1)).status_code == 200
    dq.clock.t += 200
    await dq.tick()
    assert (await dq.peek(again)).json()["state"] == "dead"
    assert (await dq.api.delete("/api/ns/q/deadletter", params={"limit": 10})).status_code == 204
    assert dq.notes() == {}
    check_queue(dq.r, "ns", "q")
    last = await dq.publish()
    await dq.consume()
    assert (await dq.progress(last, 1)).status_code == 200
    assert (await dq.api.delete("/api/ns/q")).status_code == 204
    assert dq.notes() == {} and not dq.r.exists(QK.notes)
    check_queue(dq.r, "ns", "q")


async def test_progress_racing_acks_leaves_nothing_behind(dq: DQ) -> None:
    """Progress calls racing the acks of their jobs: each is recorded before the ack (and
    goes with the record) or refused after it; no notes field outlives its job."""
    n = 30
    for _ in range(n):
        await dq.publish()
    jobs = (await dq.api.get("/api/ns/q", params={"count": n, "ttr_ms": 30_000})).json()

    async def work(job: dict[str, Any]) -> list[int]:
        jid, lease = job["job_id"], job["lease"]
        calls = [
            dq.progress(jid, {"k": k}, **({"lease": lease} if k % 2 else {})) for k in range(4)
        ]
        ack = dq.api.delete(f"/api/ns/q/job/{jid}", params={"result": "true"})
        answers = await asyncio.gather(*calls[:2], ack, *calls[2:])
        return [a.status_code for a in answers]

    codes = await asyncio.gather(*(work(j) for j in jobs))
    for per_job in codes:
        assert per_job[2] == 204
        assert set(per_job[:2] + per_job[3:]) <= {200, 404, 409}
    assert dq.notes() == {} and not dq.r.exists(QK.notes)
    for j in jobs:
        assert (await dq.peek(j["job_id"])).json()["result"] is True
    check_queue(dq.r, "ns", "q")


# -- results ----------------------------------------------------------------------------------


async def test_a_result_on_ack_is_shown_for_its_keep_time_then_trimmed(dq: DQ) -> None:
    jid = await dq.publish()
    job = await dq.consume()
    acked_at = dq.clock.t
    r = await dq.api.delete(
        f"/api/ns/q/job/{jid}", params={"lease": job["lease"], "result": '{"total": 42}'}
    )
    assert r.status_code == 204 and r.content == b""
    assert (await dq.peek(jid)).json() == {
        "namespace": "ns",
        "queue": "q",
        "job_id": jid,
        "state": "acked",
        "result": {"total": 42},
        "acked_at_ms": acked_at,
    }
    for key in (QK.results, QK.results_due):
        assert 0 < dq.r.pttl(key) <= KEEP_S * 1000  # nothing left behind on an idle queue
    dq.clock.t += KEEP_S * 1000 - 1
    assert (await dq.peek(jid)).status_code == 200
    dq.clock.t += 1
    r = await dq.peek(jid)
    assert r.status_code == 404 and r.json() == {"error": "job not found"}
    assert dq.r.hexists(QK.results, id_to_member(jid))  # not shown; trimmed by the next one
    other = await dq.publish()
    r = await dq.api.delete(f"/api/ns/q/job/{other}", params={"result": "1"})
    assert r.status_code == 204
    assert not dq.r.hexists(QK.results, id_to_member(jid))
    assert dq.r.zscore(QK.results_due, id_to_member(jid)) is None
    assert dq.r.hlen(QK.results) == 1 and (await dq.peek(other)).json()["result"] == 1
    check_queue(dq.r, "ns", "q")


async def test_an_ack_without_a_result_is_lmstfys_and_writes_no_result(dq: DQ) -> None:
    jid = await dq.publish()
    await dq.consume()
    r = await dq.api.delete(f"/api/ns/q/job/{jid}")
    assert r.status_code == 204 and r.content == b""
    r = await dq.peek(jid)
    assert r.status_code == 404 and r.json() == {"error": "job not found"}
    assert not dq.r.exists(QK.results) and not dq.r.exists(QK.results_due)
    # a body on the DELETE (which lmstfy ignores) is still ignored: only result= carries one
    jid = await dq.publish()
    r = await dq.api.request("DELETE", f"/api/ns/q/job/{jid}", content=b'{"result": 1}')
    assert r.status_code == 204 and (await dq.peek(jid)).status_code == 404
    assert not dq.r.exists(QK.results)


async def test_a_result_for_a_job_that_is_not_there_is_not_kept(dq: DQ) -> None:
    missing = "01M84CMJGD0005J92T828HTERV"
    r = await dq.api.delete(f"/api/ns/q/job/{missing}", params={"result": '"x"'})
    assert r.status_code == 204
    assert (await dq.peek(missing)).status_code == 404
    assert not dq.r.exists(QK.results)


async def test_a_result_with_a_stale_lease_is_409_and_keeps_nothing(dq: DQ) -> None:
    jid = await dq.publish(tries=2)
    first = (await dq.consume(ttr_ms=1_000))["lease"]
    dq.clock.t += 1_500
    second = (await dq.consume())["lease"]
    r = await dq.api.delete(f"/api/ns/q/job/{jid}", params={"lease": first, "result": "1"})
    assert r.status_code == 409 and r.json()["state"] == "reserved"
    assert (await dq.peek(jid)).json()["state"] == "reserved"
    assert not dq.r.exists(QK.results)
    r = await dq.api.delete(f"/api/ns/q/job/{jid}", params={"lease": second, "result": "2"})
    assert r.status_code == 204 and (await dq.peek(jid)).json()["result"] == 2


@pytest.mark.parametrize(
    ("result", "status"),
    [("not json", 400), ("", 400), ("Infinity", 400), ('"' + "r" * MAX_NOTE_BYTES + '"', 413)],
)
async def test_a_bad_result_refuses_the_ack_whole(dq: DQ, result: str, status: int) -> None:
    jid = await dq.publish()
    r = await dq.api.delete(f"/api/ns/q/job/{jid}", params={"result": result})
    assert r.status_code == status and "result" in r.json()["error"]
    assert (await dq.peek(jid)).json()["state"] == "ready"  # not acked
    assert not dq.r.exists(QK.results)


async def test_concurrent_acks_with_results_each_keep_their_own(dq: DQ) -> None:
    """Acks with results (outside the group commit) racing plain acks (grouped): every job is
    acked once, each result is its own job's, and the plain ones keep none."""
    n = 40
    ids = [await dq.publish() for _ in range(n)]
    jobs = (await dq.api.get("/api/ns/q", params={"count": n, "ttr_ms": 30_000})).json()
    assert len(jobs) == n
    lease = {j["job_id"]: j["lease"] for j in jobs}

    async def ack(i: int, jid: str) -> httpx.Response:
        if i % 3 == 0:
            return await dq.api.delete(f"/api/ns/q/job/{jid}")
        query = {"result": json.dumps({"job": jid, "i": i})}
        if i % 3 == 1:
            query["lease"] = lease[jid]
        return await dq.api.delete(f"/api/ns/q/job/{jid}", params=query)

    answers = await asyncio.gather(*(ack(i, jid) for i, jid in enumerate(ids)))
    assert [a.status_code for a in answers] == [204] * n
    for i, jid in enumerate(ids):
        r = await dq.peek(jid)
        if i % 3 == 0:
            assert r.status_code == 404
        else:
            assert r.status_code == 200 and r.json()["result"] == {"job": jid, "i": i}
    assert dq.r.hlen(QK.results) == dq.r.zcard(QK.results_due) == n - len(ids[::3])
    sizes = (await dq.api.get("/api/ns/q/size")).json()
    assert (sizes["size"], sizes["reserved"]) == (0, 0)
    check_queue(dq.r, "ns", "q")


async def test_a_batch_ack_keeps_each_jobs_result(dq: DQ) -> None:
    ids = [await dq.publish() for _ in range(4)]
    jobs = (await dq.api.get("/api/ns/q", params={"count": 4, "ttr_ms": 30_000})).json()
    lease = {j["job_id"]: j["lease"] for j in jobs}
    missing = "01M84CMJGD0005J92T828HTERV"
    body = [
        {"job_id": ids[0], "lease": lease[ids[0]], "result": {"n": 0}},
        {"job_id": ids[1], "result": None},  # null is a result too
        ids[2],
        {"job_id": ids[3], "lease": lease[ids[3]]},
        {"job_id": missing, "result": "nobody's"},
    ]
    r = await dq.api.post("/api/ns/q/ack", json=body)
    assert r.status_code == 200
    assert r.json() == {"msg": "acked", "acked": 4, "not_found": [missing]}
    first, second = (await dq.peek(ids[0])).json(), (await dq.peek(ids[1])).json()
    assert first["result"] == {"n": 0} and first["state"] == "acked"
    assert second["result"] is None and second["state"] == "acked"
    for jid in (ids[2], ids[3], missing):
        assert (await dq.peek(jid)).status_code == 404
    assert dq.r.hlen(QK.results) == 2
    check_queue(dq.r, "ns", "q")


@pytest.mark.parametrize(
    ("element", "status"),
    [
        ({"result": "r" * MAX_NOTE_BYTES}, 413),
        ({"result": float("nan")}, 400),
        ({"result": 1, "extra": 2}, 400),
    ],
)
async def test_a_bad_result_in_a_batch_acks_nothing(
    dq: DQ, element: dict[str, Any], status: int
) -> None:
    ids = [await dq.publish() for _ in range(2)]
    body = json.dumps([ids[0], {"job_id": ids[1], **element}])  # NaN as Python writes it
    r = await dq.api.post("/api/ns/q/ack", content=body.encode())
    assert r.status_code == status, r.text
    assert (await dq.api.get("/api/ns/q/size")).json()["size"] == 2
    assert not dq.r.exists(QK.results)
    twice = [{"job_id": ids[0], "result": 1}, {"job_id": ids[0], "result": 2}]
    r = await dq.api.post("/api/ns/q/ack", json=twice)
    assert r.status_code == 400 and "different results" in r.json()["error"]
    assert (await dq.api.get("/api/ns/q/size")).json()["size"] == 2


async def test_destroy_removes_results(dq: DQ) -> None:
    jid = await dq.publish()
    assert (await dq.api.delete(f"/api/ns/q/job/{jid}", params={"result": "[]"})).is_success
    assert (await dq.peek(jid)).json()["result"] == []
    assert (await dq.api.delete("/api/ns/q")).status_code == 204
    assert (await dq.peek(jid)).status_code == 404
    assert not dq.r.exists(QK.results) and not dq.r.exists(QK.results_due)


async def test_a_live_job_wins_over_a_kept_result_of_its_id(dq: DQ) -> None:
    """A client id acked with a result and published again (after the acked-id memory):
    peek shows the live job."""
    jid = await dq.publish(job_id="order-7")
    assert (await dq.api.delete(f"/api/ns/q/job/{jid}", params={"result": '"v1"'})).is_success
    dq.clock.t += 61_000  # past AckedIdMemorySecond: the id may be published again
    assert await dq.publish(job_id="order-7") == jid
    job = (await dq.peek(jid)).json()
    assert job["state"] == "ready" and "result" not in job


# -- the JSON rule, every case ---------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=examples(300), deadline=None)
@given(value=JSON, pretty=st.booleans())
def test_a_note_is_any_json_value_within_the_limit(value: Any, pretty: bool) -> None:
    text = json.dumps(value, indent=2 if pretty else None, allow_nan=False)
    if len(text.encode()) > MAX_NOTE_BYTES:
        with pytest.raises(BodyTooLarge):
            params.note(text, "progress")
        return
    stored = params.note(text, "progress")
    assert json.loads(stored) == value
    assert len(stored) <= len(text.encode())  # compact: never larger than what was sent


def _refuse(constant: str) -> Any:
    raise ValueError(constant)


@settings(max_examples=examples(300), deadline=None)
@given(raw=st.binary(max_size=64))
def test_anything_but_json_is_a_400(raw: bytes) -> None:
    try:  # JSON (no NaN/Infinity) that UTF-8 can carry (no lone surrogates)
        json.dumps(json.loads(raw, parse_constant=_refuse), ensure_ascii=False).encode()
        is_json = True
    except (ValueError, RecursionError):
        is_json = False
    if is_json:
        assert json.loads(params.note(raw, "result")) == json.loads(raw)
    else:
        with pytest.raises(BadRequest) as e:
            params.note(raw, "result")
        assert not isinstance(e.value, BodyTooLarge) and e.value.parameter == "result"
