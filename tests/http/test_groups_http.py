"""Groups over HTTP, through a real ``cluster-dq serve`` on every topology: ``group`` on
publish and in the consume reply, a group's settings changed at run time (concurrency, pause,
rate), the listing, a long-poll woken when a group's slot frees, and bad input (a 400 naming
the parameter, nothing written)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.support import size


def consume(api: httpx.Client, n: int = 10, timeout: int = 0) -> list[dict]:
    r = api.get("/api/ns/q", params={"ttr": 30, "count": n, "timeout": timeout})
    if r.status_code == 404:
        return []
    assert r.status_code == 200, r.text
    body = r.json()
    return body if isinstance(body, list) else [body]  # count > 1: a list (lmstfy)


def test_group_travels_with_the_job_and_lmstfy_sees_no_change(api: httpx.Client) -> None:
    plain = api.put("/api/ns/q", content=b"x")
    assert set(plain.json()) == {"msg", "job_id"}
    grouped = api.put("/api/ns/q", params={"group": "tenant-1"}, content=b"y")
    assert grouped.status_code == 201 and set(grouped.json()) == {"msg", "job_id"}
    peeked = api.get(f"/api/ns/q/job/{grouped.json()['job_id']}").json()
    assert peeked["group"] == "tenant-1"
    assert "group" not in api.get(f"/api/ns/q/job/{plain.json()['job_id']}").json()
    jobs = consume(api)
    assert {j.get("group") for j in jobs} == {None, "tenant-1"}
    bulk = api.put("/api/ns/q/bulk", params={"group": "tenant-2"}, content=b'["a","b"]')
    assert bulk.status_code == 201
    assert [j["group"] for j in consume(api)] == ["tenant-2", "tenant-2"]


def test_a_groups_settings_change_at_run_time(api: httpx.Client) -> None:
    # a rate that never binds here (100 turns a ms): what comes back after the resume is the
    # concurrency limit's, not a turn of the rate that timing may or may not have reached
    r = api.patch("/api/ns/q/groups/t1", json={"concurrency": 1, "rate": "100000/1s"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "namespace": "ns",
        "queue": "q",
        "group": "t1",
        "size": 0,
        "reserved": 0,
        "held": 0,
        "paused": False,
        "concurrency": 1,
        "rate": "100000/1000ms",
    }
    for _ in range(3):
        api.put("/api/ns/q", params={"group": "t1"}, content=b"x")
    api.put("/api/ns/q", params={"group": "t2"}, content=b"y")
    got = consume(api)
    assert sorted(j["group"] for j in got) == ["t1", "t2"]
    g = api.get("/api/ns/q/groups/t1").json()
    assert (g["size"], g["reserved"], g["held"]) == (3, 1, 2)
    assert size(api)["size"] == 2  # held jobs are ready
    listing = api.get("/api/ns/q/groups").json()
    assert {x["group"]: x["size"] for x in listing["groups"]} == {"t1": 3, "t2": 1}
    assert listing["cursor"] == ""
    paused = api.post("/api/ns/q/groups/t1/pause").json()
    assert paused["paused"] is True
    t1 = next(j for j in got if j["group"] == "t1")
    assert api.delete(f"/api/ns/q/job/{t1['job_id']}").status_code == 204
    assert consume(api) == []  # a slot freed, but the group is paused
    resumed = api.post("/api/ns/q/groups/t1/resume").json()
    assert (resumed["paused"], resumed["held"]) == (False, 1)  # one slot: one back
    assert [j["group"] for j in consume(api)] == ["t1"]
    cleared = api.patch("/api/ns/q/groups/t1", json={"concurrency": None, "rate": None}).json()
    assert (cleared["concurrency"], cleared["rate"], cleared["held"]) == (None, None, 0)


def test_a_long_poll_wakes_when_its_groups_slot_frees(api: httpx.Client) -> None:
    api.patch("/api/ns/q/groups/solo", json={"concurrency": 1})
    api.put("/api/ns/q", params={"group": "solo"}, content=b"1")
    api.put("/api/ns/q", params={"group": "solo"}, content=b"2")
    (first,) = consume(api)
    got: list[list[dict]] = []

    def wait() -> None:  # on a client of its own: httpx clients are not for two threads
        with httpx.Client(base_url=api.base_url, headers=api.headers, timeout=30) as other:
            got.append(consume(other, 1, timeout=10))

    waiter = threading.Thread(target=wait)
    began = time.monotonic()
    waiter.start()
    time.sleep(0.5)
    assert api.delete(f"/api/ns/q/job/{first['job_id']}").status_code == 204
    waiter.join(15)
    assert got and len(got[0]) == 1 and got[0][0]["group"] == "solo"
    assert time.monotonic() - began < 5  # woken by the ack, not by its timeout


@pytest.mark.parametrize(
    ("method", "path", "kw", "parameter"),
    [
        ("put", "/api/ns/q", {"params": {"group": ""}}, "group"),
        ("put", "/api/ns/q", {"params": {"group": "a b"}}, "group"),
        ("put", "/api/ns/q", {"params": {"group": "x" * 65}}, "group"),
        ("patch", "/api/ns/q/groups/g", {"json": {"concurrency": 0}}, "concurrency"),
        ("patch", "/api/ns/q/groups/g", {"json": {"concurrency": True}}, "concurrency"),
        ("patch", "/api/ns/q/groups/g", {"json": {"rate": "fast"}}, "rate"),
        ("patch", "/api/ns/q/groups/g", {"json": {"rate": "0/1s"}}, "rate"),
        ("patch", "/api/ns/q/groups/g", {"json": {"rate": " 1/1s "}}, "rate"),  # (as OpenAPI)
        ("patch", "/api/ns/q/groups/g", {"json": {"rate": "1/25h"}}, "rate"),
        ("patch", "/api/ns/q/groups/g", {"json": {"paused": "yes"}}, "paused"),
        ("patch", "/api/ns/q/groups/g", {"json": {"limit": 1}}, "limit"),
        ("patch", "/api/ns/q/groups/g", {"content": b"[1]"}, "body"),
        ("get", "/api/ns/q/groups/bad%20name", {}, "group"),
        ("get", "/api/ns/q/groups", {"params": {"cursor": "x"}}, "cursor"),
        (
            "get",
            "/api/ns/q/groups",
            {"params": {"cursor": "\u00b2"}},
            "cursor",
        ),  # a digit to isdigit
        ("get", "/api/ns/q/groups", {"params": {"cursor": str(2**64)}}, "cursor"),
        ("get", "/api/ns/q/groups", {"params": {"limit": 0}}, "limit"),
    ],
)
def test_bad_input_is_a_400_that_writes_nothing(
    api: httpx.Client, method: str, path: str, kw: dict, parameter: str
) -> None:
    r = getattr(api, method)(path, **kw)
    assert r.status_code == 400, r.text
    assert parameter in r.json()["error"], r.json()  # the message names what was wrong
    assert size(api) == {**size(api), "size": 0, "delayed": 0}
    g = api.get("/api/ns/q/groups/g").json()
    assert (g["concurrency"], g["rate"], g["paused"]) == (None, None, False)
