"""The sync executor drives the very same operations (batch tools, Spark partitions)."""

from __future__ import annotations

import redis
from redis.cluster import RedisCluster

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.localredis import Cluster, Server, start_server
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


def test_the_sync_engine_has_the_async_engines_surface() -> None:
    """The Spark pipeline and the batch tools drive the same operations as the service: the
    sync executor answers to the same public methods with the same arguments and defaults."""
    import inspect

    from cluster_dq.engine.aio import AsyncEngine

    def surface(cls: type) -> dict[str, list[inspect.Parameter]]:
        return {
            n: list(inspect.signature(f).parameters.values())
            for n, f in inspect.getmembers(cls, inspect.isfunction)
            if not n.startswith("_") or n == "__init__"
        }

    sync, aio = surface(SyncEngine), surface(AsyncEngine)
    assert sync.keys() == aio.keys() and {"run", "ping", "ensure_scripts"} <= sync.keys()
    for name, params in sync.items():
        if name == "__init__":  # the same arguments, but for the client's class
            params, theirs = params[2:], aio[name][2:]
            assert params == theirs
            continue
        assert params == aio[name], name
        assert inspect.iscoroutinefunction(getattr(AsyncEngine, name)), name


def test_a_sync_failure_says_whether_the_operation_may_have_written() -> None:
    """As the async engine's: refused before anything ran, the error says nothing was written
    (a once-only call may be repeated); refused after an earlier step wrote, it says nothing of
    the kind. (The sync engine raised both without a word, ``nothing_written`` None.)"""
    from cluster_dq.engine.steps import Cmd, EngineConfig, Op
    from cluster_dq.errors import RedisFailure

    def write_then(*steps: tuple[str, ...]) -> Op[None]:
        for args in steps:
            yield Cmd(args)

    server = start_server()
    client = server.sync_client()
    try:
        engine = SyncEngine(client, EngineConfig(retry_budget_s=0.2))
        client.config_set("min-replicas-to-write", 1)  # every write: NOREPLICAS, refused
        try:
            engine.run(write_then(("SET", "k", "v")))
        except RedisFailure as e:
            assert e.nothing_written is True, e
        else:
            raise AssertionError("a write to a master without its replicas went through")
        client.config_set("min-replicas-to-write", 0)
        try:
            engine.run(write_then(("SET", "k", "v"), ("INCR", "k")))  # the second step fails
        except RedisFailure as e:
            assert e.nothing_written is False, e
        else:
            raise AssertionError("INCR of a string went through")
        assert client.get("k") == b"v"
        client.script_flush()
        assert engine.ensure_scripts()
        assert all(client.script_exists(*(s.sha for s in engine.scripts.values())))
    finally:
        client.close()
        server.stop()
