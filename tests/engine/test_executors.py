"""The async and the sync executor are two shells over one core (engine/core.py): the same
operation table, run through both against real Redis, gives the same results, and the faults
both must handle (a stale master's NOREPLICAS, a flushed script cache, a killed connection,
an unreachable server, an error reply) end the same way in both."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Generator
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from cluster_dq.clock import now_ms
from cluster_dq.engine import admin, core
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import Cmd, EngineConfig, Op
from cluster_dq.engine.steps import lua
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.errors import (
    Conflict,
    NotReplicated,
    RedisFailure,
    ServerError,
    StaleMaster,
    Transient,
    Unsent,
)
from cluster_dq.keys import BUCKET_WIDTH_MS, QueueKeys, shard_of
from cluster_dq.localredis import Server
from cluster_dq.models import JobSpec, JobState, id_to_member
from cluster_dq.pools import close_client, make_client, make_sync_client
from cluster_dq.settings import PoolSettings
from tests.support import Deployment, flush

# A scenario yields (name, operation, run options) and gets back the result, or the error.
Scenario = Generator[tuple[str, Op[Any], dict[str, Any]], Any, None]
NS, Q = "ex", "q"


def normal(value: Any) -> Any:
    """A result, comparable across runs: a delivery's lease is random, the rest is not."""
    if isinstance(value, BaseException):
        return (type(value).__name__, str(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.asdict(value)
        fields.pop("lease", None)
        return (type(value).__name__, fields)
    if isinstance(value, (list, tuple)):
        return [normal(v) for v in value]
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    return value


def operations(t: int) -> Scenario:
    """Every kind of operation: the service's, the pump's, the admin keys'."""
    cfg = EngineConfig()
    specs = [
        JobSpec(b"a", job_id="j-a", tries=3),
        JobSpec(b"b", job_id="j-b", delay_ms=60_000),
        JobSpec(b"c", job_id="j-c", tries=1),
    ]
    yield "publish", ops.publish(cfg, NS, Q, specs, t), {"idempotent": True, "durable": True}
    yield "publish again", ops.publish(cfg, NS, Q, specs[:1], t), {"idempotent": True}
    batches = [
        (NS, f"bulk-{i}", [JobSpec(b"m", job_id=f"m-{i}")]) for i in range(8)
    ]  # on several nodes
    yield "publish many", ops.publish_many(cfg, batches, t), {"idempotent": True, "durable": True}
    yield (
        "known",
        ops.known_ids(NS, Q, ["j-a", "j-x"], t, cfg.remember_acked_ms),
        {"idempotent": True},
    )
    yield "sizes", ops.sizes(cfg, NS, Q), {"idempotent": True}
    yield "peek", ops.peek(cfg, NS, Q, "ready", t), {"idempotent": True}
    yield "peek job", ops.peek_job(NS, Q, "j-b"), {"idempotent": True}
    jobs = yield "consume", ops.consume(cfg, NS, [Q], 30_000, 2, t + 1), {}
    lease = {j.job_id: j.lease for j in jobs}
    yield (
        "touch",
        ops.touch(cfg, NS, Q, "j-a", 40_000, t + 2, lease["j-a"]),
        {"idempotent": True, "durable": True},
    )
    yield (
        "touch, wrong lease",
        ops.touch(cfg, NS, Q, "j-a", 40_000, t + 2, "00" * 8),
        {"idempotent": True},
    )
    yield (
        "release",
        ops.release(cfg, NS, Q, ["j-c"], 0, t + 3, nack=True, leases=[lease["j-c"]]),
        {"durable": True},
    )
    yield "dead head", ops.peek(cfg, NS, Q, "dead", t + 3), {"idempotent": True}
    yield (
        "ack",
        ops.ack(NS, Q, ["j-a"], t + 4, leases=[lease["j-a"]]),
        {"idempotent": True, "durable": True},
    )
    yield "respawn", ops.respawn(cfg, NS, Q, 10, 0, t + 5), {}
    new = JobSpec(b"d", job_id="j-d")
    yield (
        "republish",
        ops.republish(cfg, NS, Q, "j-c", new, t + 6),
        {"idempotent": True, "durable": True},
    )
    yield "dump ready", ops.dump_page(NS, Q, JobState.READY, 0), {"idempotent": True}
    yield "dump wheel", ops.dump_wheel(NS, Q), {"idempotent": True}
    shard = shard_of(f"{NS}/{Q}", cfg.shards)
    epoch = yield "lead", ops.lead(shard, "me", 10_000), {}
    yield "claim", ops.claim(shard, t + 61_000, 10, 1_000, epoch), {"idempotent": True}
    yield "tick", ops.tick(cfg, NS, Q, t + 61_000), {"idempotent": True}
    yield "reschedule", ops.reschedule(shard, f"{NS}/{Q}", t + 90_000, epoch), {"idempotent": True}
    yield "fenced", ops.claim(shard, t + 61_000, 10, 1_000, epoch + 1), {"idempotent": True}
    yield "next schedule", ops.next_schedule(shard), {"idempotent": True}
    yield "shard queues", ops.queues_of_shard(shard), {"idempotent": True}
    yield "sizes of", ops.sizes_of(cfg, [f"{NS}/{Q}"]), {"idempotent": True}
    yield "reconcile", ops.reconcile(cfg, [QueueKeys(NS, Q)], t + 61_000), {"idempotent": True}
    yield "rate limit", ops.rate_limit("{admin}:ex-rl", 1, 60_000), {}
    yield "rate limit used up", ops.rate_limit("{admin}:ex-rl", 1, 60_000), {}
    yield "token", admin.add_token("default", NS, "t" * 26, "mine"), {}
    yield "token again", admin.add_token("default", NS, "t" * 26, "mine"), {}
    yield "tokens", admin.tokens("default", NS), {}
    yield "limit", admin.set_limit("default", NS, "t" * 26, '{"read": 1}', True), {}
    yield "limits", admin.limits(), {}
    yield "delete dead", ops.delete_dead(NS, Q, 10), {}
    yield "destroy", ops.destroy(cfg, NS, Q), {"idempotent": True}
    yield "sizes at the end", ops.sizes(cfg, NS, Q), {"idempotent": True}


async def run_async(engine: AsyncEngine, scenario: Scenario) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    result: Any = None
    while True:
        try:
            name, op, options = scenario.send(result)
        except StopIteration:
            return out
        try:
            result = await engine.run(op, **options)
        except (RedisFailure, Conflict) as e:
            result = e
        out.append((name, normal(result)))


def run_sync(engine: SyncEngine, scenario: Scenario) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    result: Any = None
    while True:
        try:
            name, op, options = scenario.send(result)
        except StopIteration:
            return out
        try:
            result = engine.run(op, **options)
        except (RedisFailure, Conflict) as e:
            result = e
        out.append((name, normal(result)))


# the steps whose answer is a key's time to live (PTTL), which runs on while the test does
ON_REDIS_CLOCK = {"rate limit", "rate limit used up"}


def durable(deployment: Deployment) -> dict[str, int]:
    """One replica must confirm each durable write: a standalone server has none (NotReplicated,
    in both, soon), a Cluster's masters and a Sentinel group's master have them (in time)."""
    return {"wait_replicas": 1, "wait_timeout_ms": 20 if isinstance(deployment, Server) else 2_000}


async def test_the_same_operations_give_the_same_results(
    deployment: Deployment, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    settings = deployment.pool_settings()
    client = make_client(settings)
    if isinstance(client, AsyncRedisCluster):
        await client.initialize()  # as RedisPool.start does
    try:
        got_async = await run_async(
            AsyncEngine(client, clock=lambda: t, **durable(deployment)), operations(t)
        )
    finally:
        await close_client(client)
    flush(sync_redis)
    sync_client = make_sync_client(settings)
    try:
        got_sync = run_sync(
            SyncEngine(sync_client, clock=lambda: t, **durable(deployment)), operations(t)
        )
    finally:
        sync_client.close()
    assert [name for name, _ in got_async] == [name for name, _ in got_sync]
    for (name, a), (_, s) in zip(got_async, got_sync, strict=True):
        if name in ON_REDIS_CLOCK:  # ms left in the window: only its sign
            a, s = a > 0, s > 0
        assert a == s, name
    results = dict(got_async)
    standalone = isinstance(deployment, Server)
    assert (results["publish many"][0] == "NotReplicated") is standalone, results["publish many"]
    assert results["publish again"][0][1]["duplicate"]  # not a vacuous run
    assert results["touch, wrong lease"][0] == "Conflict"
    assert results["fenced"][0] == "Fenced" and "FENCED" in results["fenced"][1]
    # a unit taken answers the ms left in its window (a refund goes only to that window)
    assert 0 < results["rate limit"] <= 60_000 and results["rate limit used up"] == 0
    assert results["token again"] is False


# -- faults, on one standalone server -----------------------------------------------------


class Both:
    """An async and a sync engine on the same server, with the same options."""

    def __init__(self, settings: PoolSettings, **options: Any) -> None:
        self.aio = AsyncEngine(make_client(settings), **options)
        self.sync = SyncEngine(make_sync_client(settings), **options)

    async def run(self, make: Any, **options: Any) -> tuple[Any, Any]:
        """Runs a fresh ``make()`` through each: their results (or errors), normalised."""
        outcomes = []
        for engine in (self.aio, self.sync):
            try:
                if isinstance(engine, AsyncEngine):
                    result: Any = await engine.run(make(), **options)
                else:
                    result = engine.run(make(), **options)
            except RedisFailure as e:
                result = e
            outcomes.append(result)
        return outcomes[0], outcomes[1]

    async def close(self) -> None:
        await close_client(self.aio.client)
        self.sync.client.close()


def set_one(key: str) -> Op[Any]:
    return (yield Cmd(("SET", key, "1")))


async def test_a_stale_master_is_refused_and_both_ask_again(
    redis_server: Server, standalone_redis: redis.Redis
) -> None:
    """NOREPLICAS (``min-replicas-to-write 1`` on a server without replicas): a step not safe
    to repeat is told at once (nothing was written), and the idle connections are dropped; a
    refused script is repeated, so it goes through once the server takes writes again."""
    both = Both(redis_server.pool_settings())
    cfg = both.aio.config
    t = now_ms()
    try:
        standalone_redis.config_set("min-replicas-to-write", 1)
        a, s = await both.run(lambda: set_one("ex:k"))
        assert isinstance(a, StaleMaster) and isinstance(s, StaleMaster), (a, s)
        assert normal(a) == normal(s)
        assert standalone_redis.get("ex:k") is None  # nothing written
        assert not any(
            c.is_connected for c in both.aio.client.connection_pool._available_connections
        )
        assert not any(c._sock for c in both.sync.client.connection_pool._available_connections)
        for engine in (both.aio, both.sync):
            specs = [JobSpec(b"x", job_id=f"j-{type(engine).__name__}")]
            reopen = threading.Timer(0.3, standalone_redis.config_set, ("min-replicas-to-write", 0))
            reopen.start()
            if isinstance(engine, AsyncEngine):
                (p,) = await engine.run(ops.publish(cfg, NS, Q, specs, t))
            else:
                (p,) = engine.run(ops.publish(cfg, NS, Q, specs, t))
            reopen.join()
            assert not p.duplicate
            standalone_redis.config_set("min-replicas-to-write", 1)
    finally:
        standalone_redis.config_set("min-replicas-to-write", 0)
        await both.close()


async def test_a_flushed_script_cache_is_reloaded(
    redis_server: Server, standalone_redis: redis.Redis
) -> None:
    """SCRIPT FLUSH (or a failover to a server without them): one script, a pipeline of
    scripts and a durable write (script + WAIT) each load what is missing and go on."""
    both = Both(redis_server.pool_settings())
    cfg = both.aio.config
    t = now_ms()
    try:
        specs = [JobSpec(b"a", job_id="j-a"), JobSpec(b"b", job_id="j-b", delay_ms=60_000)]
        for name, make in (
            ("publish", lambda: ops.publish(cfg, NS, Q, specs, t)),
            ("sizes", lambda: ops.sizes(cfg, NS, Q)),
            ("tick", lambda: ops.tick(cfg, NS, Q, t + 61_000)),
        ):
            outcomes = []
            for engine in (both.aio, both.sync):
                standalone_redis.flushall()
                standalone_redis.script_flush()
                if isinstance(engine, AsyncEngine):
                    outcomes.append(normal(await engine.run(ops.publish(cfg, NS, Q, specs, t))))
                    standalone_redis.script_flush()
                    outcomes.append(normal(await engine.run(make(), idempotent=True)))
                else:
                    outcomes.append(normal(engine.run(ops.publish(cfg, NS, Q, specs, t))))
                    standalone_redis.script_flush()
                    outcomes.append(normal(engine.run(make(), idempotent=True)))
            assert outcomes[:2] == outcomes[2:], name
    finally:
        await both.close()


async def test_a_durable_write_waits_for_replicas_in_both(
    redis_server: Server, standalone_redis: redis.Redis
) -> None:
    """``wait_replicas`` on a server without replicas: the write is applied and WAIT counts 0
    replicas, so both raise ``NotReplicated`` with the operation's result, for one script and
    for a pipeline of them (the Spark job's bulk publish); a flushed script cache on the way
    is reloaded."""
    both = Both(redis_server.pool_settings(), wait_replicas=1, wait_timeout_ms=20)
    cfg = both.aio.config
    t = now_ms()
    specs = [JobSpec(b"a", job_id="j-a")]
    try:
        for make in (
            lambda: ops.publish(cfg, NS, Q, specs, t),
            lambda: ops.publish_many(cfg, [(NS, Q, specs)], t),
        ):
            outcomes = []
            for engine in (both.aio, both.sync):
                standalone_redis.flushall()
                standalone_redis.script_flush()
                with pytest.raises(NotReplicated) as caught:
                    if isinstance(engine, AsyncEngine):
                        await engine.run(make(), idempotent=True, durable=True)
                    else:
                        engine.run(make(), idempotent=True, durable=True)
                assert (caught.value.acked, caught.value.wanted) == (0, 1)
                outcomes.append(normal(caught.value.result))
                assert standalone_redis.hexists(
                    QueueKeys(NS, Q).jobs, "j-a"
                )  # applied on the master
            assert outcomes[0] == outcomes[1] and "j-a" in str(outcomes[0])
    finally:
        await both.close()


async def test_a_killed_connection_is_replaced(
    redis_server: Server, standalone_redis: redis.Redis
) -> None:
    """CLIENT KILL of every connection the executors hold: an operation safe to repeat runs
    on a fresh connection in both and gives the same result. One that is not safe to repeat:
    redis-py's blocking pool notices the closed idle connection before sending (so the sync
    executor goes on), its asyncio pool only when the reply is missing, so the async executor
    cannot know whether the step ran and says so (``Transient``), never a wrong result."""
    both = Both(redis_server.pool_settings())
    cfg = both.aio.config
    t = now_ms()
    try:
        await both.run(lambda: ops.sizes(cfg, NS, Q))  # connections exist now
        standalone_redis.client_kill_filter(_type="normal", skipme=True)
        a, s = await both.run(lambda: ops.sizes(cfg, NS, Q), idempotent=True)
        assert normal(a) == normal(s) and not isinstance(a, BaseException), (a, s)
        standalone_redis.client_kill_filter(_type="normal", skipme=True)
        a, s = await both.run(lambda: ops.sizes(cfg, NS, Q))
        assert isinstance(a, Transient) or normal(a) == normal(s), (a, s)
        assert not isinstance(s, BaseException), s
        standalone_redis.client_kill_filter(_type="normal", skipme=True)
        a, s = await both.run(
            lambda: ops.publish(cfg, NS, Q, [JobSpec(b"x", job_id="j-x")], t), idempotent=True
        )
        assert normal(a)[0][1]["job_id"] == "j-x"  # the first publishes it,
        assert normal(s)[0][1]["duplicate"]  # the second finds it there
    finally:
        await both.close()


async def test_unreachable_and_error_replies_are_classified_alike(
    redis_server: Server, standalone_redis: redis.Redis
) -> None:
    """A server that is not there: ``Transient`` from both (not repeated: the step is not safe
    to repeat). An error reply the engine has no meaning for: ``ServerError`` from both."""
    both = Both(redis_server.pool_settings())
    try:
        standalone_redis.set("ex:text", "not a number")

        def incr() -> Op[Any]:
            return (yield Cmd(("INCR", "ex:text")))

        a, s = await both.run(incr)
        assert isinstance(a, ServerError) and isinstance(s, ServerError) and normal(a) == normal(s)
    finally:
        await both.close()
    both = Both(PoolSettings("default", Addr="127.0.0.1:1"))  # nothing listens there
    try:
        a, s = await both.run(lambda: set_one("ex:k"))
        assert isinstance(a, Transient) and isinstance(s, Transient), (a, s)
        assert type(a.__cause__).__name__ == type(s.__cause__).__name__ == "ConnectionError"
    finally:
        await both.close()


def test_a_step_that_only_reads_is_repeated_on_any_transient_error() -> None:
    """Whatever its operation: a multi-queue consume's first look (EXISTS + HGET per queue)
    may have run or not, it wrote nothing, so a lost reply repeats it rather than failing the
    consume. A step that writes keeps its operation's rule: repeated only when nothing of it
    was sent (``Unsent``)."""
    look = (Cmd(("EXISTS", "dq:{n/a}:ready")), Cmd(("HGET", "dq:{n/a}:meta", "next")))
    assert core.plan(look, idempotent=False, durable=False, budget_s=5.0).retry_on == (Transient,)
    sizes = lua("sizes", {"queue": QueueKeys("n", "a").all_fixed()}, open_lead=5_000)
    assert core.plan(sizes, idempotent=False, durable=False, budget_s=5.0).retry_on == (Transient,)
    write = (Cmd(("EXISTS", "dq:{n/a}:ready")), Cmd(("DEL", "dq:{n/a}:ready")))
    assert core.plan(write, idempotent=False, durable=False, budget_s=5.0).retry_on == (Unsent,)


class _RefuseFirstConsume(AsyncEngine):
    """Refuses the first attempt of the first consume script (NOREPLICAS: nothing ran) and
    moves its clock on meanwhile, as a refusal and its backoff take time."""

    def __init__(self, client: Any, clock: list[int], stall_ms: int) -> None:
        super().__init__(client, EngineConfig(), clock=lambda: clock[0])
        self.now, self.stall_ms, self.refused = clock, stall_ms, False

    async def _step(self, step: ops.Step) -> Any:
        if isinstance(step, ops.Eval) and step.script == "consume" and not self.refused:
            self.refused = True
            self.now[0] += self.stall_ms
            raise redis.ResponseError("NOREPLICAS Not enough good replicas to write.")
        return await super()._step(step)


async def test_the_steps_after_a_repeated_one_run_at_the_repeats_time(
    engine: AsyncEngine,
) -> None:
    """A consume refused, then repeated 100 ms later, finds a wheel bucket that is due to open
    by then (not yet at the consume's first time): the consume opens it itself, at the
    repeat's time, like every step of the operation after the repeat. (It used to pick the
    buckets to open by its first time: none, and the bucket waited for the pump.)"""
    start = (now_ms() // BUCKET_WIDTH_MS + 2) * BUCKET_WIDTH_MS
    first = start - engine.config.open_lead_ms - 50  # the bucket opens 50 ms after this
    published = first - 10_000
    spec = JobSpec(b"w", delay_ms=start + 1_000 - published, ttl_ms=0)
    (p,) = await engine.run(ops.publish(engine.config, "st", "a", [spec], published))
    qk = QueueKeys("st", "a")
    assert await engine.client.zcard(qk.wheel) == 1
    clock = [first]
    refusing = _RefuseFirstConsume(engine.client, clock, stall_ms=100)
    assert await refusing.run(ops.consume(refusing.config, "st", ["a"], 30_000, 1, first)) == []
    assert refusing.refused
    assert await engine.client.zcard(qk.wheel) == 0  # opened by the consume itself
    assert await engine.client.zscore(qk.delayed, id_to_member(p.job_id)) == start + 1_000
