"""While one Cluster master is down (killed here, before the Cluster fails it over), the
service's calls to the other masters go on: a script a healthy master has not cached (a
promoted replica has none) runs there, cached by EVAL on that node alone, and closing the
client leaves no socket open. A private Cluster of 3 masters, its node timeout long enough
that none is failed over meanwhile."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import pytest

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.keys import QueueKeys
from cluster_dq.localredis import Cluster, Server, start_cluster
from cluster_dq.models import JobSpec
from cluster_dq.pools import RedisPool

NS = "outage"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = start_cluster(node_timeout_ms=60_000, replicas=0)
    yield c
    c.stop()


@pytest.fixture
async def pool(cluster: Cluster) -> AsyncIterator[RedisPool]:
    p = RedisPool.create(cluster.pool_settings(), EngineConfig())
    await p.start(run_pump=False)
    yield p
    await p.close()


def on_two_masters(cluster: Cluster, tag: str) -> tuple[str, str, Server]:
    """Two queue names whose keys live on different masters, and the first one's master."""
    client = cluster.sync_client()
    try:
        names = [f"{tag}{i}" for i in range(64)]
        port = {n: client.get_node_from_key(QueueKeys(NS, n).ready).port for n in names}
    finally:
        client.close()
    down = names[0]
    up = next(n for n in names if port[n] != port[down])
    return down, up, cluster.server_on(port[down])


class Down:
    """The server killed (SIGKILL, its data saved just before) until ``resume``: restarted on
    its port and directory, it rejoins the Cluster with its slots and its jobs."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.down = False

    def __enter__(self) -> Down:
        with self.server.client() as r:
            r.save()
        self.server.kill()
        self.down = True
        return self

    def resume(self) -> None:
        """Restarted, and back once it says the Cluster is ok (a restarted master answers
        CLUSTERDOWN for a few seconds, until it has heard from the others)."""
        if self.down:
            self.server.restart()
            self.down = False
            deadline = time.monotonic() + 30
            with self.server.client() as r:
                while b"cluster_state:ok" not in r.execute_command("CLUSTER", "INFO"):
                    assert time.monotonic() < deadline, "the restarted master did not rejoin"
                    time.sleep(0.1)

    def __exit__(self, *_: object) -> None:
        self.resume()


async def publish(pool: RedisPool, q: str, body: bytes, delay_ms: int = 0) -> str:
    engine = pool.engine
    op = ops.publish(engine.config, NS, q, [JobSpec(body, delay_ms=delay_ms)], now_ms())
    (job,) = await engine.run(op, idempotent=True)
    return job.job_id


async def test_a_script_not_cached_on_a_healthy_master_runs_there_while_another_is_down(
    cluster: Cluster, pool: RedisPool
) -> None:
    """A promoted replica has no script cached. Loading one must not need every master (what
    redis-py's fallback does on a Cluster): the call runs on its own node, cached there by EVAL."""
    down_q, up_q, server = on_two_masters(cluster, "flush")
    client = cluster.sync_client()
    try:
        up = cluster.server_on(client.get_node_from_key(QueueKeys(NS, up_q).ready).port)
    finally:
        client.close()
    with Down(server), up.client() as node:
        node.script_flush()
        job_id = await publish(pool, up_q, b"published with its script flushed")
        (job,) = await pool.hub.consume(NS, [up_q], 30_000, 1, 0)
        assert job.job_id == job_id
