"""Runtime hardening (issue 14): a pump shard that outlives Redis error replies, a long-poll
whose client hung up, bounded long-polls, shutdown and supervision that lose nothing, and
bounded metric labels. Real redis-server processes, real `cluster-dq serve` processes."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.localredis import Server, start_server
from cluster_dq.models import JobSpec
from cluster_dq.pools import close_client, make_client
from cluster_dq.pump import Pump


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
