"""The service layer in-process, for faults the HTTP tests cannot provoke: a reply lost after
Redis ran the script (injected by wrapping the engine's step, Redis itself is real)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import EngineConfig, Eval
from cluster_dq.errors import PoolUnavailable
from cluster_dq.localredis import Server
from cluster_dq.models import JobSpec
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import load


@pytest.fixture
async def service(redis_server: Server, standalone_redis: redis.Redis) -> AsyncIterator[Service]:
    settings = load(None, {"CLUSTER_DQ_POOL__DEFAULT__ADDR": f"127.0.0.1:{redis_server.port}"})
    pool = RedisPool.create(settings.Pool["default"], EngineConfig())
    await pool.start(run_pump=False)
    yield Service(settings, {"default": pool})
    await pool.close()


async def test_a_release_whose_reply_is_lost_is_not_repeated_onto_another_consumers_reservation(
    service: Service,
) -> None:
    """Consumer A releases its job; Redis runs the release, and before A hears back, consumer
    B reserves the job. A's reply is lost. A blind retry would now release B's reservation
    (the retry policy repeated release until this was found). Instead A gets a 503 saying the
    release may have happened, and B keeps its job."""
    route = service.route("default")
    engine = service.pools["default"].engine
    cfg = engine.config
    (published,) = await service.publish(route, "svc", "q", [JobSpec(b"x", tries=3)])
    (a,) = await engine.run(ops.consume(cfg, "svc", ["q"], 30_000, 1, now_ms()))
    holder: list[Any] = []
    real_step = engine._step

    async def run_then_lose_the_reply(step: Any) -> Any:
        reply = await real_step(step)
        if isinstance(step, Eval) and step.script == "release" and not holder:
            holder.extend(await engine.run(ops.consume(cfg, "svc", ["q"], 30_000, 1, now_ms())))
            raise RedisConnectionError("reply lost")
        return reply

    engine._step = run_then_lose_the_reply  # type: ignore[method-assign]
    try:
        with pytest.raises(PoolUnavailable, match="the release may have been applied"):
            await service.release(route, "svc", "q", a.job_id, 0)
    finally:
        del engine._step
    assert [j.job_id for j in holder] == [published.job_id]  # B holds the job
    sizes = await engine.run(ops.sizes(cfg, "svc", "q"))
    assert (sizes.ready, sizes.reserved) == (0, 1)  # still B's
    state = await engine.run(ops.peek_job("svc", "q", published.job_id))
    assert state is not None and state.deliveries == 2  # A's and B's, nothing more


async def test_a_503_says_what_may_have_happened(service: Service) -> None:
    """SPEC §2.7: a 503 says whether the outcome is unknown. A consume whose reply was lost
    is answered "no job" (lmstfy's batch consume answers 404 on errors too): it may have
    reserved jobs nobody got, which come back after their ttr. Refused by a stale master on
    every attempt, nothing ran: a consume says no job was reserved, a publish that nothing
    was written, both that repeating is safe."""
    route = service.route("default")
    engine = service.pools["default"].engine
    await service.publish(route, "svc", "q", [JobSpec(b"x", tries=3)])
    real_step = engine._step

    async def lose_consume_replies(step: Any) -> Any:
        reply = await real_step(step)
        if isinstance(step, Eval) and step.script == "consume":
            raise RedisConnectionError("reply lost")
        return reply

    engine._step = lose_consume_replies  # type: ignore[method-assign]
    try:
        assert await service.consume(route, "svc", ["q"], 30_000, 1, 0) == []
    finally:
        del engine._step

    async def refuse(step: Any) -> Any:
        if isinstance(step, Eval) and step.script in ("publish", "consume"):
            raise ResponseError("NOREPLICAS Not enough good replicas to write.")
        return await real_step(step)

    engine._step = refuse  # type: ignore[method-assign]
    try:
        with pytest.raises(PoolUnavailable, match="no job was reserved .*repeating it is safe"):
            await service.consume(route, "svc", ["q"], 30_000, 1, 0)
        with pytest.raises(PoolUnavailable, match="nothing was written .*repeating it is safe"):
            await service.publish(route, "svc", "q", [JobSpec(b"y")])
    finally:
        del engine._step
    sizes = await engine.run(ops.sizes(engine.config, "svc", "q"))
    assert (sizes.ready, sizes.reserved) == (0, 1)  # the lost consume's reservation; no new job


@pytest.mark.parametrize("bulk", [1, 5])
async def test_a_publish_repeated_after_a_lost_reply_does_not_call_its_own_job_a_duplicate(
    service: Service, bulk: int
) -> None:
    """Redis ran the publish and the reply was lost; the engine repeats it (the ids were fixed
    before the first attempt) and finds the jobs there. Jobs whose ids the service made up can
    only be there because of that first attempt: they are answered as published, not as
    duplicates (a 201 with ``"duplicate": true`` for a job no one else could have made), and
    counted once."""
    route = service.route("default")
    engine = service.pools["default"].engine
    real_step = engine._step
    lost: list[str] = []

    async def lose_the_first_reply(step: Any) -> Any:
        reply = await real_step(step)
        if isinstance(step, Eval) and step.script == "publish" and not lost:
            lost.append(step.script)
            raise RedisConnectionError("reply lost")
        return reply

    engine._step = lose_the_first_reply  # type: ignore[method-assign]
    try:
        out = await service.publish(route, "svc", "lost", [JobSpec(b"x")] * bulk)
    finally:
        engine._step = real_step  # type: ignore[method-assign]
    assert lost
    assert [p.duplicate for p in out] == [False] * bulk
    assert (await service.sizes(route, "svc", "lost")).ready == bulk
