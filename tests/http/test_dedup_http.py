"""Deduplication and the Idempotency-Key over HTTP, through a real ``cluster-dq serve``: the
parameters, the header, the replies and the errors (a 400 writes nothing)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.support import size

IDEM = "Idempotency-Key"


def test_a_publish_without_keys_answers_as_lmstfy(api: httpx.Client) -> None:
    r = api.put("/api/ns/q", content=b"x")
    assert r.status_code == 201 and set(r.json()) == {"msg", "job_id"}
    assert "idempotent-replayed" not in r.headers


def test_simple_dedup_answers_the_existing_job(api: httpx.Client) -> None:
    first = api.put("/api/ns/q", params={"dedup_key": "order-42"}, content=b"a")
    assert first.status_code == 201
    assert first.json() == {"msg": "published", "job_id": first.json()["job_id"], "dedup": "new"}
    again = api.put("/api/ns/q", params={"dedup_key": "order-42", "delay": 5}, content=b"b")
    assert again.status_code == 201
    assert again.json() == {**first.json(), "dedup": "existing"}
    assert size(api)["size"] == 1 and size(api)["delayed"] == 0
    job = api.get("/api/ns/q", params={"ttr": 30}).json()
    assert api.delete(f"/api/ns/q/job/{job['job_id']}").status_code == 204
    third = api.put("/api/ns/q", params={"dedup_key": "order-42"}, content=b"c")
    assert third.json()["dedup"] == "new" and third.json()["job_id"] != job["job_id"]


def test_throttle_and_debounce(api: httpx.Client) -> None:
    throttle = {"dedup_key": "t", "dedup_mode": "throttle", "dedup_ttl": 60_000}
    first = api.put("/api/ns/q", params=throttle, content=b"a").json()
    job = api.get("/api/ns/q", params={"ttr": 30}).json()
    api.delete(f"/api/ns/q/job/{job['job_id']}")
    again = api.put("/api/ns/q", params=throttle, content=b"b").json()
    assert again == {**first, "dedup": "existing"}  # within its window, though acked
    assert size(api)["size"] == 0

    debounce = {"dedup_key": "d", "dedup_mode": "debounce", "delay": 60}
    first = api.put("/api/ns/q", params=debounce, content=b"v1").json()
    second = api.put("/api/ns/q", params={**debounce, "delay": 0}, content=b"v2").json()
    assert second == {**first, "dedup": "replaced"}
    job = api.get("/api/ns/q", params={"ttr": 30}).json()
    assert job["job_id"] == first["job_id"] and job["data"] == "djI="  # v2
    refused = api.put("/api/ns/q", params=debounce, content=b"v3")
    assert refused.status_code == 409
    assert refused.json()["state"] == "reserved" and refused.json()["job_id"] == first["job_id"]
    assert "not replaced" in refused.json()["error"]


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ({"dedup_key": ""}, "dedup_key"),
        ({"dedup_key": "a b"}, "dedup_key"),
        ({"dedup_key": "x" * 129}, "dedup_key"),
        ({"dedup_key": "k", "dedup_mode": "sometimes"}, "dedup_mode"),
        ({"dedup_key": "k", "dedup_mode": "throttle"}, "dedup_ttl"),
        ({"dedup_key": "k", "dedup_mode": "throttle", "dedup_ttl": "0"}, "dedup_ttl"),
        ({"dedup_key": "k", "dedup_mode": "throttle", "dedup_ttl": "-1"}, "dedup_ttl"),
        (
            {"dedup_key": "k", "dedup_mode": "throttle", "dedup_ttl": str(31 * 86_400_000)},
            "dedup_ttl",
        ),
        ({"dedup_key": "k", "dedup_ttl": "1000"}, "dedup_ttl"),
        ({"dedup_key": "k", "dedup_ttl": "0"}, "dedup_ttl"),  # 0 is no window either
        ({"dedup_key": "k", "dedup_mode": "debounce", "dedup_ttl": "5"}, "dedup_ttl"),
        ({"dedup_mode": "simple"}, "dedup_mode"),
        ({"dedup_ttl": "5"}, "dedup_ttl"),
    ],
)
def test_bad_dedup_parameters_are_a_400_and_write_nothing(
    api: httpx.Client, query: dict[str, str], parameter: str
) -> None:
    r = api.put("/api/ns/q", params=query, content=b"x")
    assert r.status_code == 400, r.text
    assert parameter in r.json()["error"]
    assert size(api)["size"] == 0


@pytest.mark.parametrize(
    "query",
    [{"dedup_key": "k"}, {"dedup_mode": "debounce"}, {"dedup_ttl": "junk"}, {"dedup_ttl": "5"}],
)
def test_dedup_parameters_are_refused_in_a_bulk(api: httpx.Client, query: dict[str, str]) -> None:
    r = api.put("/api/ns/q/bulk", params=query, content=b"[1, 2]")
    assert r.status_code == 400 and next(iter(query)) in r.json()["error"]
    assert size(api)["size"] == 0


def test_routes_that_take_no_keys_refuse_them(api: httpx.Client) -> None:
    """A dedup parameter or an Idempotency-Key on a route that does not take it is a 400 naming
    it, nothing done (not ignored: the client would take the write for deduplicated)."""
    jid = api.put("/api/ns/q", content=b"a").json()["job_id"]
    job = f"/api/ns/q/job/{jid}"
    refused = [
        api.put(job, params={"dedup_key": "k"}, content=b"b"),  # republish
        api.put(job, params={"dedup_mode": "simple"}, content=b"b"),
        api.put(job, headers={IDEM: "r-1"}, content=b"b"),
        api.post(f"{job}/bury", headers={IDEM: "r-2"}),
        api.post("/api/ns/q/ack", headers={IDEM: "r-3"}, json=[jid]),
        api.delete(job, params={"dedup_key": "k"}),
        api.get("/api/ns/q", params={"ttr": 30, "dedup_key": "k"}),
        api.put("/api/ns/q/schedules/s1", headers={IDEM: "r-4"}, json={"every": 60}),
    ]
    for r in refused:
        assert r.status_code == 400, (r.request.url, r.text)
        assert "dedup_" in r.json()["error"] or IDEM in r.json()["error"]
    assert api.get(job).json()["state"] == "ready"
    assert (size(api)["size"], size(api)["reserved"]) == (1, 0)
    assert api.get("/api/ns/q/schedules").json().get("schedules", []) == []


def test_two_idempotency_keys_are_a_400(api: httpx.Client) -> None:
    two = [(IDEM, "k1"), (IDEM, "k2")]
    for path, body in (("/api/ns/q", b"x"), ("/api/ns/q/bulk", b"[1]")):
        r = api.put(path, headers=two, content=body)
        assert r.status_code == 400 and IDEM in r.json()["error"]
    assert size(api)["size"] == 0


@pytest.mark.parametrize("key", [b"", b"x" * 256, "caf\u00e9".encode(), b"a b"])
def test_a_bad_idempotency_key_is_a_400(api: httpx.Client, key: bytes) -> None:
    r = api.put("/api/ns/q", headers={IDEM: key}, content=b"x")
    assert r.status_code == 400 and IDEM in r.json()["error"]
    assert size(api)["size"] == 0


def test_an_idempotency_key_repeats_the_first_answer(api: httpx.Client) -> None:
    first = api.put("/api/ns/q", params={"delay": 30}, headers={IDEM: "pay-1"}, content=b"a")
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    again = api.put("/api/ns/q", params={"delay": 30}, headers={IDEM: "pay-1"}, content=b"a")
    assert (again.status_code, again.json()) == (201, first.json())
    assert again.headers["idempotent-replayed"] == "true"
    assert size(api)["delayed"] == 1
    other = api.put("/api/ns/q", params={"delay": 30}, headers={IDEM: "pay-1"}, content=b"b")
    assert other.status_code == 422 and IDEM in other.json()["error"]
    changed = api.put("/api/ns/q", params={"delay": 31}, headers={IDEM: "pay-1"}, content=b"a")
    assert changed.status_code == 422
    assert size(api)["delayed"] == 1
    # per queue: the same key on another queue is another request
    elsewhere = api.put("/api/ns/q2", params={"delay": 30}, headers={IDEM: "pay-1"}, content=b"a")
    assert elsewhere.status_code == 201 and "idempotent-replayed" not in elsewhere.headers


def test_an_idempotency_key_on_a_bulk(api: httpx.Client) -> None:
    body = json.dumps([{"n": 1}, {"n": 2}, {"n": 3}]).encode()
    first = api.put("/api/ns/q/bulk", headers={IDEM: "bulk-1"}, content=body)
    assert first.status_code == 201 and len(first.json()["job_ids"]) == 3
    again = api.put("/api/ns/q/bulk", headers={IDEM: "bulk-1"}, content=body)
    assert (again.status_code, again.json()) == (201, first.json())
    assert again.headers["idempotent-replayed"] == "true"
    assert size(api)["size"] == 3
    assert api.put("/api/ns/q/bulk", headers={IDEM: "bulk-1"}, content=b"[1]").status_code == 422
    # a one-job publish under a bulk's key is another request
    assert api.put("/api/ns/q", headers={IDEM: "bulk-1"}, content=body).status_code == 422
    assert size(api)["size"] == 3


def test_the_trace_context_attributes_are_not_part_of_the_request(api: httpx.Client) -> None:
    """A traced client puts a new span's context into the attributes of each attempt: a repeat
    differing only in traceparent and tracestate is the same request; another attribute not."""

    def attrs(span: str, **more: str) -> dict[str, str]:
        trace = f"00-{'a' * 32}-{span * 16}-01"
        extra = {f"Job-Attr-{k}": v for k, v in more.items()}
        return {"Enable-Job-Version": "YES", "Job-Attr-traceparent": trace, **extra}

    first = api.put("/api/ns/q", headers={IDEM: "t-1", **attrs("1", tracestate="v=1")})
    again = api.put("/api/ns/q", headers={IDEM: "t-1", **attrs("2", tracestate="v=2")})
    assert first.status_code == 201 and again.status_code == 201, again.text
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    bare = api.put("/api/ns/q", headers={IDEM: "t-1", "Enable-Job-Version": "YES"})
    assert bare.status_code == 201 and bare.json() == first.json()  # none sent at all
    other = api.put("/api/ns/q", headers={IDEM: "t-1", **attrs("3", tracestate="v=1", x="1")})
    assert other.status_code == 422 and IDEM in other.json()["error"]
    assert size(api)["size"] == 1


def test_a_job_id_repeated_under_its_dedup_key_is_a_duplicate(api: httpx.Client) -> None:
    first = api.put("/api/ns/q", params={"job_id": "A1", "dedup_key": "K"}, content=b"a")
    again = api.put("/api/ns/q", params={"job_id": "A1", "dedup_key": "K"}, content=b"a")
    assert first.json() == {"msg": "published", "job_id": "A1", "dedup": "new"}
    assert again.json() == {**first.json(), "dedup": "existing", "duplicate": True}
    debounce = {"job_id": "B1", "dedup_key": "D", "dedup_mode": "debounce", "delay": 100}
    api.put("/api/ns/q", params=debounce, content=b"v1")
    v2 = api.put("/api/ns/q", params=debounce, content=b"v2").json()
    assert v2 == {"msg": "published", "job_id": "B1", "dedup": "replaced"}
    assert api.get("/api/ns/q/job/B1").json()["data"] == "djI="  # v2
    assert (size(api)["size"], size(api)["delayed"]) == (1, 1)


def test_a_debounce_under_a_dead_job_names_its_state(api: httpx.Client) -> None:
    """A dead simple or debounce holder is taken over; a throttle window's dead job still holds
    the key, and the 409 says it is dead (not 'reserved')."""
    first = api.put("/api/ns/q", params={"dedup_key": "d", "dedup_mode": "debounce"}).json()
    assert api.post(f"/api/ns/q/job/{first['job_id']}/bury").status_code == 200
    taken = api.put("/api/ns/q", params={"dedup_key": "d", "dedup_mode": "debounce"}).json()
    assert taken["dedup"] == "new" and taken["job_id"] != first["job_id"]
    window = {"dedup_key": "t", "dedup_mode": "throttle", "dedup_ttl": 60_000}
    held = api.put("/api/ns/q", params=window).json()["job_id"]
    assert api.post(f"/api/ns/q/job/{held}/bury").status_code == 200
    r = api.put("/api/ns/q", params={"dedup_key": "t", "dedup_mode": "debounce"})
    assert r.status_code == 409 and r.json()["state"] == "dead"
    assert "a dead job is not replaced" in r.json()["error"]


def test_a_job_looked_up_by_id_names_its_dedup_key(api: httpx.Client) -> None:
    """GET of a job says which dedup key it was published under (a simple or debounce key);
    a job published without one has no such field, as before."""
    keyed = api.put("/api/ns/q", params={"dedup_key": "order-7", "delay": 60}, content=b"a")
    plain = api.put("/api/ns/q", content=b"b")
    got = api.get(f"/api/ns/q/job/{keyed.json()['job_id']}").json()
    assert got["dedup_key"] == "order-7" and got["state"] == "delayed"
    assert "dedup_key" not in api.get(f"/api/ns/q/job/{plain.json()['job_id']}").json()
    reserved = api.get("/api/ns/q", params={"ttr": 30}).json()  # the plain one (ready)
    assert "dedup_key" not in reserved


async def test_concurrent_keyed_publishes_share_calls_and_each_gets_its_own_answer(
    api: httpx.Client,
) -> None:
    """Many one-job publishes under keys at once (the service's group commit runs them in
    shared script calls): one job per key, every request answered for its own key, and a
    request whose Idempotency-Key came with another body refused alone."""
    api.put("/api/ns/q", headers={IDEM: "idem-x"}, content=b"first")
    async with httpx.AsyncClient(base_url=api.base_url, headers=api.headers) as a:

        async def put(i: int) -> httpx.Response:
            if i % 10 == 9:  # another body under idem-x: a 422, alone
                return await a.put("/api/ns/q", headers={IDEM: "idem-x"}, content=b"other")
            return await a.put("/api/ns/q", params={"dedup_key": f"k{i % 3}"}, content=b"x")

        got = await asyncio.gather(*(put(i) for i in range(60)))
    codes = [r.status_code for i, r in enumerate(got) if i % 10 != 9]
    assert codes == [201] * 54
    assert [r.status_code for i, r in enumerate(got) if i % 10 == 9] == [422] * 6
    by_key: dict[str, set[str]] = {}
    for i, r in enumerate(got):
        if i % 10 != 9:
            by_key.setdefault(f"k{i % 3}", set()).add(r.json()["job_id"])
    assert all(len(ids) == 1 for ids in by_key.values()) and len(by_key) == 3
    news = [r.json()["dedup"] for i, r in enumerate(got) if i % 10 != 9]
    assert news.count("new") == 3 and news.count("existing") == 51
    assert size(api)["size"] == 4  # first, and one job per key


def test_a_debounce_replacement_starts_afresh_without_the_old_bodys_progress_or_error(
    api: httpx.Client,
) -> None:
    """The replaced body is a new piece of work: the old one's progress (a checkpoint a worker
    would resume from, skipping work on the new body) and its last error go with it. Found by
    a hostile review: failed before (both kept)."""
    debounce = {"dedup_key": "k", "dedup_mode": "debounce", "tries": 3}
    first = api.put("/api/ns/q", params=debounce, content=b"v1").json()["job_id"]
    job = api.get("/api/ns/q", params={"ttr": 30}).json()
    lease = {"lease": job["lease"]}
    assert api.put(f"/api/ns/q/job/{first}/progress", params=lease, json={"pct": 50}).is_success
    released = api.post(f"/api/ns/q/job/{first}/release", params={**lease, "error": "half"})
    assert released.is_success
    before = api.get(f"/api/ns/q/job/{first}").json()
    assert (before["progress"], before["last_error"]) == ({"pct": 50}, "half")
    again = api.put("/api/ns/q", params=debounce, content=b"v2").json()
    assert (again["job_id"], again["dedup"]) == (first, "replaced")
    after = api.get(f"/api/ns/q/job/{first}").json()
    assert after["data"] == "djI="  # v2
    assert "progress" not in after and "last_error" not in after, after


def test_an_idempotency_key_tells_a_query_value_from_the_body(api: httpx.Client) -> None:
    """The fingerprint joined the query's values and the body with separators a value could
    contain (a NUL then a letter), so two different requests could share one: the second was
    answered as the first and its body never published. Found by a hostile review: failed
    before (the second was a replay)."""
    first = api.put("/api/ns/q?z=1%00bHELLO%00b", headers={IDEM: "fp-1"}, content=b"X")
    assert first.status_code == 201
    other = api.put("/api/ns/q?z=1", headers={IDEM: "fp-1"}, content=b"HELLO\0b\0bX")
    assert other.status_code == 422 and IDEM in other.json()["error"]
    # a name holding '=' is not the same as a value holding it either
    named = api.put("/api/ns/q?a%3Db=c", headers={IDEM: "fp-2"}, content=b"Y")
    assert named.status_code == 201
    valued = api.put("/api/ns/q?a=b%3Dc", headers={IDEM: "fp-2"}, content=b"Y")
    assert valued.status_code == 422
    assert size(api)["size"] == 2
