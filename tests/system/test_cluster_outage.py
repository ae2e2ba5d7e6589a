"""A consume across queues on a Cluster does not wait on a master that is down before the
healthy ones: while one master does not answer (killed here, before the Cluster fails it
over), the jobs of the queues on the other masters are delivered, to a
consume that finds them ready and to a long-poll that waits for them; once the master answers
again, its queue's jobs are delivered too, and nothing is lost or delivered twice. A private
Cluster of 3 masters, its node timeout long enough that none is failed over meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine import wire
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.keys import QueueKeys
from cluster_dq.localredis import Cluster, Server, start_cluster
from cluster_dq.models import JobSpec
from cluster_dq.pools import RedisPool

NS = "reach"
STOPPED_S = 12.0  # a long-poll's timeout while the master is down (resumed as soon as it can be)


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


async def test_a_consume_takes_a_healthy_masters_job_while_another_master_is_down(
    cluster: Cluster, pool: RedisPool
) -> None:
    down_q, up_q, server = on_two_masters(cluster, "ready")
    first = await publish(pool, down_q, b"on the stopped master")
    second = await publish(pool, up_q, b"on a healthy master")
    with Down(server) as stopped:
        # a consume that does not wait (the first look of every HTTP consume)
        jobs = await pool.hub.consume(NS, [down_q, up_q], 30_000, 1, 0)
        assert [j.job_id for j in jobs] == [second]
        stopped.resume()
        # its queue is looked at again once it answers: its job is delivered
        (job,) = await pool.hub.consume(NS, [down_q, up_q], 30_000, 1, 10_000)
        assert job.job_id == first


async def test_a_long_poll_gets_a_healthy_masters_job_while_another_master_is_down(
    cluster: Cluster, pool: RedisPool
) -> None:
    down_q, up_q, server = on_two_masters(cluster, "wait")
    later = await publish(pool, down_q, b"due once the master is back", delay_ms=1_500)
    with Down(server) as stopped:
        waiting = asyncio.create_task(
            pool.hub.consume(NS, [down_q, up_q], 30_000, 1, int(STOPPED_S * 1000))
        )
        await asyncio.sleep(1.0)  # the long-poll has looked (and failed on the stopped master)
        assert not waiting.done()
        published = await publish(pool, up_q, b"published while the other master is down")
        jobs = await waiting
        assert stopped.down, "the long-poll waited until the master was back"
        assert [j.job_id for j in jobs] == [published]
        stopped.resume()
        (job,) = await pool.hub.consume(NS, [down_q, up_q], 30_000, 1, 10_000)
        assert job.job_id == later
        assert await pool.hub.consume(NS, [down_q, up_q], 30_000, 1, 0) == []


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


async def test_commands_failing_on_a_master_that_is_down_do_not_refresh_the_topology_each(
    cluster: Cluster, pool: RedisPool
) -> None:
    """Every command that cannot reach a node has redis-py refresh the whole topology (CLUSTER
    SLOTS, then every connection to every node marked for reconnect): with watchers, the pump
    and notices each failing on a master that is down, the commands to the healthy masters
    paid a reconnect each (their latency went from 2 ms to 80 ms). A refresh is made at most
    every ``wire.REFRESH_S``, and none fails a command to a healthy master."""
    down_q, up_q, server = on_two_masters(cluster, "refresh")
    client = pool.engine.client
    assert isinstance(client, RedisCluster)
    # the node it asks for the command table is the one that goes down (redis-py's refresh then
    # failed, and with it the command that asked for it, on a healthy master too)
    client.set_default_node(client.get_node_from_key(QueueKeys(NS, down_q).ready))

    def refreshes() -> int:
        total = 0
        for s in cluster.servers:
            if s is not server:
                with s.client() as r:
                    stats = r.info("commandstats").get("cmdstat_cluster|slots", {})
                    total += int(stats.get("calls", 0))
        return total

    with Down(server):
        before, started = refreshes(), time.monotonic()
        for _ in range(20):  # 10 tasks asking the master that is down, 20 times each
            await asyncio.gather(
                *(client.get(QueueKeys(NS, down_q).ready) for _ in range(10)),
                return_exceptions=True,
            )
            await client.get(QueueKeys(NS, up_q).ready)
        took = time.monotonic() - started
        made = refreshes() - before
    assert made <= took / wire.REFRESH_S + 2, (made, took)
