"""Real redis-server processes on loopback, started for the session and stopped after it.

The behaviour suite (every test that takes ``engine``, ``sync_redis`` or the HTTP ``service``)
runs once per topology: standalone, a 3-master + 3-replica Cluster, and a Sentinel group
(1 master + 2 replicas + 3 sentinels). ``DQ_TOPOLOGIES=standalone`` narrows it for a quick run.
If redis-server cannot be started the tests error out (in CI and locally alike): nothing in
this suite is ever skipped for want of Redis.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

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

# The long run's share (``./deploy/dev/test-long`` runs every test): each is a further topology
# or size of a guarantee the default run already shows with another, left out of the default
# run (marked ``long``, deselected by pyproject's ``-m "not long"``) to keep it near 15 minutes.
LONG = (
    # no failover here: the engine's guarantees under churn, as on standalone and Cluster
    "tests/test_guarantees.py::test_many_consumers_random_delays_ttrs_and_tries[sentinel]",
    # both executors agree on Cluster and Sentinel; on standalone every durable write waits out
    # its retries to fail alike (test_a_durable_write_waits_for_replicas_in_both shows that)
    "tests/test_executors.py::test_the_same_operations_give_the_same_results[standalone]",
    # the load profile through nginx runs on standalone; on Cluster in the long run
    "tests/test_loadtest.py::test_short_profile_through_nginx_has_no_errors[cluster]",
    # without durable publish a failover may lose acknowledged writes: only reported
    "tests/test_history.py::test_history_redis_master_killed[sentinel-not-durable]",
    "tests/test_history.py::test_history_redis_master_killed[cluster-not-durable]",
    # the commands' CLI around functions tests/test_drills.py and test_history.py run in-process
    "tests/test_bench_commands.py::test_command_runs_small_and_prints_figures[drill.py]",
    "tests/test_bench_commands.py::test_command_runs_small_and_prints_figures[history.py]",
    # the load profile's short run is tests/test_loadtest.py's, in-process; this is its CLI
    "tests/test_bench_commands.py::test_command_runs_small_and_prints_figures[load_profile.py]",
    # the pipeline's own tests run Spark on every topology; this is its benchmark's CLI
    "tests/test_bench_commands.py::test_command_runs_small_and_prints_figures[bench_pipeline.py]",
)

# Suites of the HTTP surface (the service, its client, worker and dashboard) run on Sentinel in
# the long run only: behind Sentinel the service runs the same scripts on one master as on a
# standalone server, over a connection Sentinel names. What Sentinel itself changes (discovery,
# failover, replicas, durable writes) is tested in the default run by the engine and guarantee
# suites on Sentinel and by test_durable, test_outages, test_drills and test_history.
LONG_ON_SENTINEL = {
    f"tests/{name}.py"
    for name in (
        "test_http",
        "test_control",
        "test_progress",
        "test_schedules",
        "test_queue_control",
        "test_review_findings",
        "test_dashboard",
        "test_dashboard_panels",
        "test_client",
        "test_worker",
        "test_cli",
        "test_hostile_client",
        "test_hostile_worker",
        "test_hostile_dashboard",
        "test_hostile_dashboard_core",
        "test_security_admin",
        "test_security_paths",
        "test_security_limits",
    )
}

Deployment = Server | Cluster | SentinelGroup
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
    server.kill()


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


def flush(client: Any) -> None:
    if isinstance(client, redis.RedisCluster):
        client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        client.flushall()


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


@pytest.fixture
async def cluster_engine(redis_cluster: Cluster) -> AsyncIterator[AsyncEngine]:
    host, port = redis_cluster.seeds[0]
    client = AsyncRedisCluster(host=host, port=port)
    await client.initialize()
    await client.flushall(target_nodes=AsyncRedisCluster.PRIMARIES)
    yield AsyncEngine(client, EngineConfig())
    await client.aclose()


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the tests of ``LONG`` and the Sentinel runs of ``LONG_ON_SENTINEL``; an entry that names a test of a collected file that does
    not exist is an error (the list must not go stale when a test is renamed)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        on = callspec.params.get("deployment") if callspec is not None else None
        if on == "sentinel" and item.nodeid.split("::")[0] in LONG_ON_SENTINEL:
            item.add_marker(pytest.mark.long)
    ids = {item.nodeid: item for item in items}
    files = {item.nodeid.split("::")[0] for item in items}
    for nodeid in LONG:
        item = ids.get(nodeid)
        if item is not None:
            item.add_marker(pytest.mark.long)
        elif nodeid.split("::")[0] in files and _whole_files(config):
            topology = nodeid.rsplit("[", 1)[-1].rstrip("]").split("-")[0]
            if topology in ("standalone", "cluster", "sentinel") and topology not in TOPOLOGIES:
                continue  # narrowed away by DQ_TOPOLOGIES
            raise pytest.UsageError(f"tests/conftest.py LONG names no test: {nodeid}")


def _whole_files(config: pytest.Config) -> bool:
    """Whether whole test files were asked for: no single tests, no ``-k``."""
    return not config.getoption("keyword") and not any("::" in a for a in config.args)
