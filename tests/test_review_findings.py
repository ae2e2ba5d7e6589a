# ruff: noqa: F811  (the HTTP fixtures are imported from test_http and used as arguments)
"""Hostile review of the leases / edges change: each test reproduces one finding against a
real Redis and a real `cluster-dq serve`, and fails on the code it was written against."""

from __future__ import annotations

import time

import httpx

from tests.test_http import admin, api, service, size  # noqa: F401  (fixtures)


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


def test_head_on_token_route_creates_no_token(service: tuple[str, str], admin: httpx.Client) -> None:
    """The admin token route's handler treats every method but GET as POST (create)."""
    before = admin.get("/token/ns").json()["tokens"]
    r = admin.head("/token/ns", params={"description": "made-by-head"})
    after = admin.get("/token/ns").json()["tokens"]
    assert "made-by-head" not in after.values() and len(after) == len(before), f"HEAD ({r.status_code}) created a token"
    assert r.status_code in (200, 405)
