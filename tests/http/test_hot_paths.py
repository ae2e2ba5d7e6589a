"""The data port's hot paths (``cluster_dq/http/hot.py``) answer exactly as the router does.

The same requests (Hypothesis draws them: every method, paths with odd, empty, encoded and
overlong segments, good and bad parameters and tokens) go to the data app as served and to the
same app built without its hot paths, each time on the same Redis state (flushed and seeded
alike); status, JSON body and headers must be equal, once job ids and times are masked."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from hypothesis import example, given
from hypothesis import strategies as st

from cluster_dq.engine.commands import EngineConfig
from cluster_dq.http.app import DataAPI, build_app, create_data_app
from cluster_dq.http.middleware import AccessLog
from cluster_dq.localredis import Server
from cluster_dq.models import JobSpec
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import load
from tests.support.run import against_redis

TOKEN = "hot-paths-token-0123456789"
ULID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")
TIMES = {
    "elapsed_ms",
    "ttl",
    "ttl_ms",
    "published_at",
    "published_ms",
    "reserved_ms",
    "due_ms",
    "oldest_due_ms",
    "lateness_ms",
    "next_attempt_at",
    "died_at",
}


Apps = tuple[asyncio.Runner, Service, httpx.AsyncClient, httpx.AsyncClient]


@pytest.fixture
def apps(redis_server: Server, standalone_redis: redis.Redis) -> Iterator[Apps]:
    """Both apps on one service, in an event loop of their own (Hypothesis runs the examples
    of a synchronous test; each example runs its requests in this loop)."""
    settings_ = load(None, {"CLUSTER_DQ_POOL__DEFAULT__ADDR": f"127.0.0.1:{redis_server.port}"})
    with asyncio.Runner() as runner:
        pool = RedisPool.create(settings_.Pool["default"], EngineConfig())
        runner.run(pool.start(run_pump=False))
        service = Service(settings_, {"default": pool})
        log = AccessLog(False)
        hot = create_data_app(service, settings_, log)
        data = DataAPI(service, settings_)
        plain = build_app(
            data.routes(),
            log,
            "data",
            service.metrics,
            budget_s=settings_.RetryBudgetSecond,
            before_405=data.before_405,
        )
        a = httpx.AsyncClient(transport=httpx.ASGITransport(hot), base_url="http://dq")
        b = httpx.AsyncClient(transport=httpx.ASGITransport(plain), base_url="http://dq")
        try:
            yield runner, service, a, b
        finally:
            runner.run(a.aclose())
            runner.run(b.aclose())
            runner.run(pool.close())


segment = st.sampled_from(
    [
        "ns",
        "q",
        "q2",
        "job",
        "",
        "_x",
        "a b",
        "%2F",
        "é",
        "x" * 300,
        "01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "client-1",
        "progress",
        "settings",
        "pause",
        "resume",
        *("bury", "reschedule", "deadletter", "kick", "jobs", "redrive", "purge"),
    ]
)
query = st.lists(
    st.sampled_from(
        [
            "delay=0",
            "delay=1",
            "delay=-1",
            "delay_ms=5",
            "ttl=10",
            "tries=0",
            "tries=x",
            "timeout=0",
            "ttr=0",
            "ttr_ms=0",
            "count=2",
            "count=0",
            "job_id=client-1",
            "job_id=",
            "lease=zz",
            "result=%7B%22a%22%3A1%7D",
            "result=x",
            "token=" + TOKEN,
            "token=bad!",
            "limit=2",
            "cursor=q",
            "backoff=fixed",
            "backoff_ms=10",
            "reason=x",
            "at=5",
            "limit=1001",
        ]
    ),
    max_size=4,
).map("&".join)


def masked(r: httpx.Response) -> tuple[int, Any, dict[str, str]]:
    text = ULID.sub("<id>", r.text)
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = text
    items = body if isinstance(body, list) else [body]
    if isinstance(body, dict) and isinstance(body.get("queues"), list):  # a queue listing
        items = [body, *body["queues"]]
    for item in items:
        if isinstance(item, dict):
            for k in TIMES & item.keys():
                item[k] = "<time>"
    headers = {
        k: ULID.sub("<id>", v)
        for k, v in r.headers.items()
        if k not in ("x-request-id", "x-lease", "date", "content-length")
    }
    return r.status_code, body, headers


@against_redis(150)
@given(
    method=st.sampled_from(["PUT", "GET", "DELETE", "HEAD", "POST", "PATCH"]),
    path=st.lists(segment, min_size=1, max_size=5).map(lambda s: "/api/" + "/".join(s)),
    q=query,
    token=st.sampled_from([TOKEN, "", "no-such-token-0123456789", "bad token"]),
    body=st.sampled_from([b"", b"job", b"[1]", b"x" * 70_000]),
)
@example(method="PUT", path="/api/ns/q/job/client-1/progress", q="", token=TOKEN, body=b"[1]")
@example(method="PUT", path="/api/ns/q/job/client-1/progress", q="", token=TOKEN, body=b"job")
@example(
    method="DELETE",
    path="/api/ns/q/job/client-1",
    q="result=%7B%22a%22%3A1%7D",
    token=TOKEN,
    body=b"",
)
@example(method="DELETE", path="/api/ns/q/job/client-1", q="result=x", token=TOKEN, body=b"")
def test_the_hot_paths_answer_as_the_router_does(
    apps: Apps,
    standalone_redis: redis.Redis,
    method: str,
    path: str,
    q: str,
    token: str,
    body: bytes,
) -> None:
    runner, service, hot, plain = apps

    async def seeded() -> None:
        standalone_redis.flushall()
        await service.create_token("default", "ns", "test", TOKEN)
        service._tokens._good.data.clear()
        service._tokens._bad.data.clear()
        route = service.route("default")
        await service.publish(route, "ns", "q", [JobSpec(b"a", job_id="client-1")])
        await service.publish(route, "ns", "q", [JobSpec(b"b")])

    async def ask(client: httpx.AsyncClient) -> tuple[int, Any, dict[str, str]]:
        await seeded()
        headers = {"X-Token": token} if token else {}
        url = f"{path}?{q}" if q else path
        r = await client.request(method, url, content=body, headers=headers)
        return masked(r)

    async def both() -> None:
        a, b = await ask(hot), await ask(plain)
        assert a == b, f"{method} {path}?{q}"

    runner.run(both())


def test_the_document_is_left_to_the_router(apps: Apps) -> None:
    """``GET /openapi.json`` is no hot path: the served app answers it with its document."""
    runner, service, hot, plain = apps

    async def ask() -> httpx.Response:
        return await hot.get("/openapi.json")

    r = runner.run(ask())
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert "/api/{ns}/{queues}" in r.json()["paths"]
