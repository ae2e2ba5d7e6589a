"""The engine below HTTP: every transition and its Lua script, both executors, the wire, the
group commit, the service layer with injected faults, and the model-based test against a
reference model. On all three topologies in every run (``tests/support/run.py``). Here: an
engine on the Cluster, for the tests about the Cluster itself, and the model-based tests'
topologies (tests/support/model_harness.py: standalone by default, a Cluster too in the long
run)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.localredis import Cluster
from tests.support.model_harness import TOPOLOGIES, summary_line


@pytest.fixture
async def cluster_engine(redis_cluster: Cluster) -> AsyncIterator[AsyncEngine]:
    host, port = redis_cluster.seeds[0]
    client = AsyncRedisCluster(host=host, port=port)
    await client.initialize()
    await client.flushall(target_nodes=AsyncRedisCluster.PRIMARIES)
    yield AsyncEngine(client, EngineConfig())
    await client.aclose()


@pytest.fixture(params=TOPOLOGIES)
def deployment_for_model(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The model-based tests' topology; their figures printed after each."""
    name = {"standalone": "redis_server", "cluster": "redis_cluster"}[request.param]
    yield request.getfixturevalue(name)
    print(f"\nmodel summary ({request.param}): {summary_line()}")
