"""The sync executor drives the very same operations (batch tools, Spark partitions)."""

from __future__ import annotations

import redis
from redis.cluster import RedisCluster

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.localredis import Cluster, Server
from cluster_dq.models import JobSpec, JobState
from cluster_dq.testing.invariants import check_queue, queue_keys


def exercise(engine: SyncEngine) -> None:
    cfg = engine.config
    t = now_ms()
    published = engine.run(
        ops.publish(
            cfg,
            "s",
            "q",
            [
                JobSpec(b"now"),
                JobSpec(b"far", delay_ms=3_600_000),
                JobSpec(b"id", job_id="k-1"),
            ],
            t,
        ),
        idempotent=True,
    )
    assert [p.state for p in published] == [JobState.READY, JobState.DELAYED, JobState.READY]
    again = engine.run(ops.publish(cfg, "s", "q", [JobSpec(b"id", job_id="k-1")], t))
    assert again[0].duplicate
    jobs = engine.run(ops.consume(cfg, "s", ["q"], 1_000, 10, t))
    assert sorted(j.body for j in jobs) == [b"id", b"now"]
    assert engine.run(ops.ack("s", "q", [j.job_id for j in jobs])) == [JobState.RESERVED] * 2
    s = engine.run(ops.tick(cfg, "s", "q", t + 3_600_000 - cfg.open_lead_ms), idempotent=True)
    assert (s.delayed, s.ready) == (1, 0)
    assert engine.run(ops.destroy(cfg, "s", "q")) == 1


def test_sync_engine_on_standalone(redis_server: Server, sync_redis: redis.Redis) -> None:
    exercise(SyncEngine(sync_redis))
    check_queue(sync_redis, "s", "q")
    assert queue_keys(sync_redis, "s", "q") == []


def test_sync_engine_on_cluster(redis_cluster: Cluster) -> None:
    host, port = redis_cluster.seeds[0]
    client = RedisCluster(host=host, port=port)
    try:
        exercise(SyncEngine(client))
    finally:
        client.close()
