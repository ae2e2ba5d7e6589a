"""Real redis-server processes on loopback, started for the session and stopped after it.

If redis-server cannot be started the tests error out (in CI and locally alike): nothing in
this suite is ever skipped for want of Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.localredis import Cluster, Server, start_cluster, start_server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Server]:
    server = start_server()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Cluster]:
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def sync_redis(redis_server: Server) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
async def engine(sync_redis: redis.Redis, redis_server: Server) -> AsyncIterator[AsyncEngine]:
    client = AsyncRedis(host="127.0.0.1", port=redis_server.port)
    yield AsyncEngine(client, EngineConfig())
    await client.aclose()


@pytest.fixture
async def cluster_engine(redis_cluster: Cluster) -> AsyncIterator[AsyncEngine]:
    host, port = redis_cluster.seeds[0]
    client = AsyncRedisCluster(host=host, port=port)
    await client.initialize()
    await client.flushall(target_nodes=AsyncRedisCluster.PRIMARIES)
    yield AsyncEngine(client, EngineConfig())
    await client.aclose()


@pytest.fixture(autouse=True)
async def _dump_tasks_if_stuck() -> AsyncIterator[None]:
    """A test still running after 150 s prints every asyncio task's stack (hang diagnosis)."""
    import asyncio
    import os
    import sys

    def dump() -> None:
        print("\n=== asyncio tasks of a test running for 150 s ===", file=sys.__stderr__)
        for task in asyncio.all_tasks():
            task.print_stack(file=sys.__stderr__)

    handle = asyncio.get_running_loop().call_later(float(os.environ.get("DQ_TEST_DUMP_AFTER", "150")), dump)
    yield
    handle.cancel()
