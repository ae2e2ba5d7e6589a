# ruff: noqa: F811  (the HTTP fixtures are imported from test_http and used as arguments)
"""Leased reservations over real HTTP: every delivery carries a lease; ack, batch ack, touch,
release and republish that present one act only while that delivery holds the job, and
otherwise answer 409 naming the job's state, changing nothing. Without a lease: lmstfy's
behaviour. Also the user-visible side of two engine defects (republish of the same client id,
ttl == delay)."""

from __future__ import annotations

import time

import httpx

from tests.support import size


def consume(api: httpx.Client, q: str = "q", **params: object) -> httpx.Response:
    return api.get(f"/api/ns/{q}", params={"ttr_ms": 400, **params})


def test_a_late_ack_cannot_ack_the_job_another_consumer_now_holds(api: httpx.Client) -> None:
    jid = api.put("/api/ns/q", params={"tries": 3}, content=b"x").json()["job_id"]
    first = consume(api)
    assert first.status_code == 200
    a = first.json()["lease"]
    assert first.headers["x-lease"] == a and len(a) == 16
    time.sleep(0.6)  # a's ttr runs out; b gets the job again
    second = consume(api, ttr_ms=30_000)  # b holds it through every check below
    assert second.status_code == 200 and second.json()["job_id"] == jid
    b = second.json()["lease"]
    assert b != a
    late = api.delete(f"/api/ns/q/job/{jid}", params={"lease": a})
    assert late.status_code == 409
    assert late.json()["job_id"] == jid and late.json()["state"] == "reserved"
    job = api.get(f"/api/ns/q/job/{jid}").json()
    assert job["state"] == "reserved" and job["deliveries"] == 2  # b still holds it
    for verb, extra in (("touch", {"ttr": 5}), ("release", {})):
        r = api.post(f"/api/ns/q/job/{jid}/{verb}", params={"lease": a, **extra})
        assert r.status_code == 409 and r.json()["state"] == "reserved", verb
    r = api.put(f"/api/ns/q/job/{jid}", params={"lease": a}, content=b"y")
    assert r.status_code == 409
    assert size(api)["reserved"] == 1 and size(api)["size"] == 0
    assert api.post(f"/api/ns/q/job/{jid}/touch", params={"lease": b, "ttr": 5}).status_code == 200
    assert api.delete(f"/api/ns/q/job/{jid}", params={"lease": b}).status_code == 204
    assert api.get(f"/api/ns/q/job/{jid}").status_code == 404


def test_a_lease_whose_ttr_ran_out_holds_nothing_even_before_the_pump_moves_it(
    api: httpx.Client,
) -> None:
    jid = api.put("/api/ns/q", params={"tries": 2}, content=b"x").json()["job_id"]
    lease = consume(api, ttr_ms=200).json()["lease"]
    time.sleep(0.3)
    r = api.post(f"/api/ns/q/job/{jid}/touch", params={"lease": lease, "ttr": 30})
    assert r.status_code == 409 and r.json()["state"] in ("ttr_expired", "ready")
    assert api.post(f"/api/ns/q/job/{jid}/touch", params={"ttr": 30}).status_code == 404
    again = consume(api)
    assert again.json()["job_id"] == jid and again.json()["remain_tries"] == 0


def test_batch_ack_with_one_stale_lease_acks_nothing(api: httpx.Client) -> None:
    for _ in range(3):
        api.put("/api/ns/q", params={"tries": 2}, content=b"x")
    jobs = consume(api, count=3, ttr_ms=30_000).json()
    body = [{"job_id": j["job_id"], "lease": j["lease"]} for j in jobs]
    body[1]["lease"] = "0" * 16
    r = api.post("/api/ns/q/ack", json=body)
    assert r.status_code == 409 and r.json()["job_id"] == jobs[1]["job_id"]
    assert size(api)["reserved"] == 3
    body[1]["lease"] = jobs[1]["lease"]
    r = api.post("/api/ns/q/ack", json=body + [jobs[0]["job_id"]])
    assert r.status_code == 200 and r.json()["acked"] == 3
    assert size(api)["reserved"] == 0


def test_without_a_lease_ack_is_lmstfys(api: httpx.Client) -> None:
    jid = api.put("/api/ns/q", content=b"x").json()["job_id"]
    consume(api)
    assert api.delete(f"/api/ns/q/job/{jid}").status_code == 204
    assert (
        api.delete(f"/api/ns/q/job/{jid}", params={"lease": "ab" * 8}).status_code == 204
    )  # gone: fine


def test_a_malformed_lease_is_400(api: httpx.Client) -> None:
    jid = api.put("/api/ns/q", content=b"x").json()["job_id"]
    for bad in ("", "xyz", "0" * 15, "g" * 16, "0" * 17):
        r = api.delete(f"/api/ns/q/job/{jid}", params={"lease": bad})
        assert r.status_code == 400 and "lease" in r.json()["error"], bad
    r = api.post("/api/ns/q/ack", json=[{"job_id": jid, "lease": 5}])
    assert r.status_code == 400
    assert size(api)["size"] == 1


def test_republish_with_the_same_client_id_keeps_the_job(api: httpx.Client) -> None:
    api.put("/api/ns/q", params={"job_id": "order-42"}, content=b"v1")
    assert consume(api).json()["job_id"] == "order-42"
    r = api.put("/api/ns/q/job/order-42", params={"job_id": "order-42"}, content=b"v2")
    assert r.status_code == 201 and r.json() == {"msg": "published", "job_id": "order-42"}
    job = api.get("/api/ns/q/job/order-42").json()
    assert job["state"] == "ready" and job["deliveries"] == 0


def test_a_ttl_equal_to_the_delay_is_refused(api: httpx.Client) -> None:
    for params in ({"delay": 1, "ttl": 1}, {"delay_ms": 1500, "ttl_ms": 1500}):
        r = api.put("/api/ns/q", params=params, content=b"x")
        assert r.status_code == 400 and r.json()["error"] == "ttl must be longer than delay"
    r = api.put("/api/ns/q/bulk", params={"delay": 2, "ttl": 2}, json=[1, 2])
    assert r.status_code == 400
    assert size(api)["delayed"] == 0


def test_a_full_batch_ack_with_leases_fits_the_body_limit(api: httpx.Client) -> None:
    body = [{"job_id": f"{i:064d}", "lease": "0123456789abcdef"} for i in range(1000)]
    r = api.post("/api/ns/q/ack", json=body)
    assert r.status_code == 200 and r.json()["acked"] == 0 and len(r.json()["not_found"]) == 1000
