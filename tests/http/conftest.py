"""The HTTP surface through a real ``cluster-dq serve``: every route and its validation, the
edges, per-job and queue control, schedules, routing across pools, metrics, the runtime, the
OpenAPI documents and a fuzz run. On a Cluster by default, on every topology in the long run
(``tests/support/run.py``). Here: the pools of the routing suites."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import redis

from cluster_dq.localredis import Server
from cluster_dq.settings import PoolSettings
from tests.support import Deployment
from tests.support.routing import standalone_db


@pytest.fixture
def pools(
    redis_server: Server, deployment: Deployment, sync_redis: redis.Redis
) -> Iterator[dict[str, PoolSettings]]:
    """``old`` and ``c``: standalone (DBs 1 and 3); ``new`` and ``b``: the topology under
    test (on standalone, DBs 2 and 4); ``default``: the topology under test too."""
    under_test = dataclasses.replace(deployment.pool_settings(), name="new")
    if isinstance(deployment, Server):
        under_test = dataclasses.replace(under_test, DB=2)
    found = {
        "default": deployment.pool_settings(),
        "old": standalone_db(redis_server, 1, "old"),
        "new": under_test,
        "b": dataclasses.replace(under_test, name="b"),
        "c": standalone_db(redis_server, 3, "c"),
    }
    for db in (1, 2, 3):
        redis.Redis(port=redis_server.port, db=db).flushdb()
    yield found
