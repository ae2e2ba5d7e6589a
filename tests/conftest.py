"""Real redis-server processes on loopback, started for the session (per test worker) and
stopped after it, and the fixtures that hand a test its topology.

A test that takes ``deployment`` (or ``engine``, ``sync_redis``, ``served``...) runs once per
topology: standalone, a 3-master + 3-replica Cluster, and a Sentinel group (1 master + 2
replicas + 3 sentinels). Which of those the default run keeps for each folder is decided in
``tests/support/run.py``; ``DQ_TOPOLOGIES=cluster`` narrows any run. If redis-server cannot be
started the tests error out (in CI and locally alike): nothing here is ever skipped for want of
Redis.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.localredis import (
    Cluster,
    SentinelGroup,
    Server,
    start_cluster,
    start_sentinel,
    start_server,
)
from cluster_dq.pools import close_client, make_client
from tests.support import Deployment, flush

pytest_plugins = ["tests.support.fixtures", "tests.support.run"]

TOPOLOGIES = os.environ.get("DQ_TOPOLOGIES", "standalone,cluster,sentinel").split(",")
FIXTURE_OF = {
    "standalone": "redis_server",
    "cluster": "redis_cluster",
    "sentinel": "redis_sentinel",
}


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Server]:
    server = start_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Cluster]:
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[SentinelGroup]:
    group = start_sentinel()
    yield group
    group.stop()


@pytest.fixture(scope="session", params=TOPOLOGIES)
def deployment(request: pytest.FixtureRequest) -> Deployment:
    """The Redis topology the behaviour suite runs on (each test runs once per topology)."""
    found: Deployment = request.getfixturevalue(FIXTURE_OF[request.param])
    return found


@pytest.fixture
def sync_redis(deployment: Deployment) -> Iterator[redis.Redis]:
    client = deployment.sync_client()
    flush(client)
    yield client  # type: ignore[misc]
    client.close()


@pytest.fixture
def standalone_redis(redis_server: Server) -> Iterator[redis.Redis]:
    """For the few tests that are about one process and one server (crashes, outages)."""
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
async def engine(sync_redis: redis.Redis, deployment: Deployment) -> AsyncIterator[AsyncEngine]:
    client = make_client(deployment.pool_settings())
    if isinstance(client, AsyncRedisCluster):
        await client.initialize()  # as RedisPool.start does, before concurrent use
    yield AsyncEngine(client, EngineConfig())
    await close_client(client)


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A command run in-process (``cli.main`` calls ``logs.setup``) points the root logger at
    the test's captured stderr, closed when the test ends; a thread that logs later (py4j's,
    after a Spark session) would then print a "Logging error" into another test's output."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
async def _dump_tasks_if_stuck(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """A test still running after 150 s prints every asyncio task's stack (hang diagnosis),
    past pytest's output capture (which holds fd 2 until the test ends)."""
    import asyncio
    import sys

    def dump() -> None:
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(
                f"\n=== asyncio tasks of {request.node.nodeid}, running for {after:.0f} s ===",
                file=sys.stderr,
            )
            for task in asyncio.all_tasks():
                task.print_stack(file=sys.stderr)
            sys.stderr.flush()

    after = float(os.environ.get("DQ_TEST_DUMP_AFTER", "150"))
    handle = asyncio.get_running_loop().call_later(after, dump)
    yield
    handle.cancel()


@pytest.hookimpl(trylast=True)  # after pytest grouped the tests by fixture parameters
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (``tests/support/run.py``: ``FILE_SECONDS``)."""
    from tests.support.run import order_folders  # a plugin: imported once pytest registered it

    order_folders(items)
