"""Runtime hardening (issue 14): a pump shard that outlives Redis error replies, a long-poll
whose client hung up, bounded long-polls, shutdown and supervision that lose nothing, and
bounded metric labels. Real redis-server processes, real `cluster-dq serve` processes."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.keys import QueueKeys
from cluster_dq.localredis import Server, start_server
from cluster_dq.models import Job, JobSpec
from cluster_dq.pools import RedisPool, close_client, make_client
from cluster_dq.pump import Pump
from cluster_dq.service import _consume_across
from tests.test_http import ADMIN_AUTH, serve


@pytest.fixture
def own_redis() -> Server:
    """A redis-server of the test's own: these tests reconfigure or stop it."""
    server = start_server()
    yield server  # type: ignore[misc]
    server.kill()


async def _until(check: object, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while True:
        got = check() if callable(check) else check
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.05)


async def test_pump_shard_survives_an_error_reply_and_pumps_again(
    own_redis: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """OOM at maxmemory (any error reply but FENCED) used to end the shard's task for good."""
    client = make_client(own_redis.pool_settings())
    engine = AsyncEngine(client, EngineConfig(shards=1))
    # Claims every 20 ms, renewals every 10 s: the refused write is a claim, not a renewal.
    pump = Pump(engine, lease_ms=30_000, poll_ms=20, reconcile_every_s=0)
    admin = own_redis.client()
    caplog.set_level(logging.WARNING, logger="cluster_dq.pump")
    pump.start()
    try:
        await _until(lambda: pump.leads(0), "leadership of shard 0")
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
        await _until(lambda: "maxmemory" in caplog.text or pump._tasks[0].done(), "a refused claim")
        admin.config_set("maxmemory", 0)
        assert not pump._tasks[0].done(), f"the shard task ended: {pump._tasks[0]}"
        assert "maxmemory" in caplog.text  # logged, not silent
        now = now_ms()
        await engine.run(ops.publish(engine.config, "ns", "q", [JobSpec(b"x", delay_ms=300)], now))

        async def promoted() -> bool:
            return (await engine.run(ops.sizes(engine.config, "ns", "q"))).ready == 1

        await _until(promoted, "the pump moves the delayed job to ready again")
    finally:
        admin.config_set("maxmemory", 0)
        await pump.stop()
        await close_client(client)


# -- a long-poll whose client hung up ----------------------------------------------------------


def unique_ns() -> str:
    """Namespaces of this test alone (other test sessions on the machine may reach the same
    redis-server port once theirs is gone)."""
    return f"rt{uuid.uuid4().hex[:10]}"


@pytest.fixture
def svc(redis_server: Server, standalone_redis: redis.Redis) -> Iterator[tuple[str, str, str, str]]:
    """A `cluster-dq serve` on the session's redis-server: (data url, admin url, ns, token)."""
    proc, base, admin = serve(redis_server.pool_settings())
    ns = unique_ns()
    token = httpx.post(f"{admin}/token/{ns}", params={"description": "t"}, auth=ADMIN_AUTH).json()["token"]
    yield base, admin, ns, token
    proc.terminate()
    proc.wait(timeout=30)


def _hang_up_long_poll(base: str, path: str, token: str, waiting: Callable[[], bool]) -> None:
    """Sends a long-poll, waits until the server is waiting for a job on its behalf, and
    closes the connection without reading the answer."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Token: {token}\r\n\r\n".encode())
        _wait_for(waiting, "the long-poll waits")


def _wait_for(check: Callable[[], bool], what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def _subscribers(client: redis.Redis, ns: str, q: str) -> int:
    channel = QueueKeys(ns, q).notify
    return int(dict(client.pubsub_numsub(channel))[channel.encode()])


def test_a_long_poll_whose_client_hung_up_reserves_nothing(
    svc: tuple[str, str, str, str], standalone_redis: redis.Redis
) -> None:
    base, _, ns, token = svc
    _hang_up_long_poll(base, f"/api/{ns}/q?timeout=20&ttr=2", token,
                       lambda: _subscribers(standalone_redis, ns, "q") == 1)  # fmt: skip
    # Give the server a moment to hear the hang-up (its watcher then unsubscribes); without
    # the fix it never lets go, and the publish below is reserved for nobody.
    deadline = time.monotonic() + 3
    while _subscribers(standalone_redis, ns, "q") and time.monotonic() < deadline:
        time.sleep(0.02)
    with httpx.Client(base_url=base, headers={"X-Token": token}, timeout=30) as api:
        r = api.put(f"/api/{ns}/q", params={"tries": 3}, content=b"x")
        assert r.status_code == 201, r.text
        jid = r.json()["job_id"]
        r = api.get(f"/api/{ns}/q", params={"timeout": 10, "ttr": 30})
        assert r.status_code == 200, r.text
        assert r.json()["job_id"] == jid
        assert (r.json()["remain_tries"], r.json()["deliveries"]) == (2, 1), r.json()  # no try spent on nobody


async def _two_pools(server: Server) -> tuple[RedisPool, RedisPool]:
    config = EngineConfig()
    return (RedisPool.create(server.pool_settings("a"), config),
            RedisPool.create(server.pool_settings("b"), config))  # fmt: skip


@pytest.mark.parametrize("phase", ["first look", "long-poll"])
async def test_a_consume_across_pools_cancelled_gives_back(
    redis_server: Server, standalone_redis: redis.Redis, phase: str
) -> None:
    """A consume over two pools (a ring, a migration) whose caller is cancelled (the client
    hung up) gives back what one pool delivered meanwhile, try unspent."""
    a, b = await _two_pools(redis_server)
    ns = unique_ns()
    stalled, let_go = asyncio.Event(), asyncio.Event()

    async def stall(ns: str, qs: list[str], ttr_ms: int, count: int, timeout_ms: int) -> list[Job]:
        """Pool b answers slowly (its long-poll only, in the long-poll phase), and lets go slowly."""
        if phase == "long-poll" and timeout_ms == 0:
            return []
        stalled.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            let_go.set()
            await asyncio.sleep(0.3)
            raise
        return []

    b.hub.consume = stall  # type: ignore[method-assign]
    try:
        if phase == "first look":  # a's job is taken at once, then b stalls
            await a.engine.run(ops.publish(a.engine.config, ns, "qa", [JobSpec(b"x", tries=3)], now_ms()))
        consume = asyncio.create_task(_consume_across([(a, ["qa"]), (b, ["qb"])], ns, 30_000, 2, 20_000))
        if phase == "long-poll":  # both wait; a delivers; b is being cancelled when the client leaves
            await stalled.wait()
            await asyncio.sleep(0.2)
            await a.engine.run(ops.publish(a.engine.config, ns, "qa", [JobSpec(b"x", tries=3)], now_ms()))
            await let_go.wait()
        else:
            await stalled.wait()
        consume.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consume

        async def given_back() -> bool:
            s = await a.engine.run(ops.sizes(a.engine.config, ns, "qa"))
            return (s.ready, s.reserved) == (1, 0)

        await _until(given_back, "the job is ready again", within=5)
        (job,) = await a.engine.run(ops.consume(a.engine.config, ns, ["qa"], 30_000, 1, now_ms()))
        assert job.deliveries == 1  # its try was not spent
    finally:
        for p in (a, b):
            await p.close()
