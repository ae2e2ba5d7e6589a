"""Queue control on real Redis, every topology: a queue's settings, pause and resume, max size,
retry backoff and the namespace's queue listing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_dq import queueconf
from cluster_dq.backoff import Backoff, draw, wait_ms
from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.errors import BadRequest, QueueFull
from cluster_dq.queueconf import QueueSettings
from cluster_dq.keys import QueueKeys, ShardKeys, shard_of
from cluster_dq.models import JobSpec, JobState, Record, id_to_member
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import load
from cluster_dq.waiters import WaiterHub
from tests.support import Deployment
from cluster_dq.testing.invariants import check_queue
from tests.support import ADMIN_AUTH, serve
from tests.support.run import examples


class Clock:
    """The engine's clock under the test's control."""

    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


@pytest.fixture
async def service(sync_redis: redis.Redis, deployment: Deployment) -> AsyncIterator[Service]:
    base = load(None, {})
    settings = dataclasses.replace(
        base, Pool={"default": deployment.pool_settings()}, QueueSettingsCacheSecond=0.0
    )
    pool = RedisPool.create(settings.Pool["default"], EngineConfig())
    await pool.start(run_pump=False)
    yield Service(settings, {"default": pool})
    await pool.close()


def snapshot(client: Any, ns: str, q: str) -> dict[str, Any]:
    """Every key of the queue, dumped (the bytes Redis holds)."""
    qk = QueueKeys(ns, q)
    keys = [*qk.all_fixed()]
    for b in client.zrange(qk.wheel, 0, -1):
        keys.append(qk.bucket(b.decode()))
    return {k: client.dump(k) for k in keys}


# -- pause and resume ---------------------------------------------------------------------


async def test_pause_stops_deliveries_and_resume_wakes_a_waiting_long_poll(
    service: Service,
) -> None:
    route = service.route("default")
    ns = "ctl"
    await service.publish(route, ns, "p", [JobSpec(b"one", tries=3)])
    paused = await service.configure(route, ns, "p", [("paused", "1")])
    assert paused.paused
    again = await service.configure(route, ns, "p", [("paused", "1")])  # idempotent
    assert again == paused
    # one queue, and a multi-queue consume that includes it: nothing from it
    assert await service.consume(route, ns, ["p"], 30_000, 1, 0) == []
    assert await service.consume(route, ns, ["p", "other"], 30_000, 1, 0) == []
    await service.publish(route, ns, "other", [JobSpec(b"two")])
    got = await service.consume(route, ns, ["p", "other"], 30_000, 5, 0)
    assert [j.body for j in got] == [b"two"]
    # a long-poll waits on the paused queue, and resume wakes it
    waiting = asyncio.create_task(service.consume(route, ns, ["p"], 30_000, 1, 20_000))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    resumed = await service.configure(route, ns, "p", [("paused", "")])
    assert not resumed.paused
    async with asyncio.timeout(5):  # promptly: the safety poll alone would take longer
        jobs = await waiting
    assert [j.body for j in jobs] == [b"one"]
    assert (await service.configure(route, ns, "p", [("paused", "")])) == resumed


async def test_a_paused_queue_still_takes_publishes_and_its_reservations_still_expire(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    cfg, ns, q = engine.config, "ctl", "exp"
    t = now_ms()
    await engine.run(ops.publish(cfg, ns, q, [JobSpec(b"x", tries=2)], t))
    (job,) = await engine.run(ops.consume(cfg, ns, [q], 1_000, 1, t))
    await engine.run(ops.configure(engine.config, ns, q, [("paused", "1")]))
    await engine.run(ops.publish(cfg, ns, q, [JobSpec(b"y", delay_ms=500)], t))  # accepted
    sizes = await engine.run(ops.tick(cfg, ns, q, t + 2_000))  # the pump still does its part
    assert (sizes.ready, sizes.reserved, sizes.delayed) == (2, 0, 0)
    assert await engine.run(ops.consume(cfg, ns, [q], 1_000, 5, t + 2_000)) == []
    await engine.run(ops.configure(engine.config, ns, q, [("paused", "")]))
    got = await engine.run(ops.consume(cfg, ns, [q], 1_000, 5, t + 2_000))
    assert sorted(j.body for j in got) == [b"x", b"y"]
    check_queue(sync_redis, ns, q)


async def test_a_long_poll_on_a_paused_queue_with_a_due_event_waits_without_spinning(
    engine: AsyncEngine,
) -> None:
    """A paused queue whose head holds a job past its ttl (consume hands out nothing, so it
    does not drop it; the pump would): the long-poll waits for a wake-up or its safety poll,
    it does not look again and again."""
    cfg, ns, q = engine.config, "ctl", "spin"
    await engine.run(ops.publish(cfg, ns, q, [JobSpec(b"x", ttl_ms=50)], now_ms()))
    await engine.run(ops.configure(engine.config, ns, q, [("paused", "1")]))
    await asyncio.sleep(0.1)  # its ttl ends: the queue's next event is due, and stays so
    looks = 0
    real_step = engine._step

    async def counted(step: Any) -> Any:
        nonlocal looks
        looks += isinstance(step, ops.Eval) and step.script == "consume"
        return await real_step(step)

    engine._step = counted  # type: ignore[method-assign]
    hub = WaiterHub(engine)
    try:
        assert await hub.consume(ns, [q], 30_000, 1, 1_500) == []
    finally:
        await hub.close()
        engine._step = real_step  # type: ignore[method-assign]
    assert looks <= 10, looks  # a look per safety poll (1 s), not one per event-loop turn


# -- max size -----------------------------------------------------------------------------


async def test_a_full_queue_refuses_publishes_with_queue_full_and_writes_nothing(
    service: Service, sync_redis: redis.Redis
) -> None:
    route, ns, q = service.route("default"), "ctl", "full"
    await service.configure(route, ns, q, [("max_size", "3")])
    await service.publish(route, ns, q, [JobSpec(b"a", job_id="a"), JobSpec(b"b", delay_ms=60_000)])
    before = snapshot(sync_redis, ns, q)
    # a bulk of two with room for one: all or nothing
    with pytest.raises(QueueFull):
        await service.publish(route, ns, q, [JobSpec(b"c"), JobSpec(b"d", delay_ms=900_000)])
    assert snapshot(sync_redis, ns, q) == before
    await service.publish(route, ns, q, [JobSpec(b"c", delay_ms=900_000)])  # the wheel counts
    before = snapshot(sync_redis, ns, q)
    with pytest.raises(QueueFull):
        await service.publish(route, ns, q, [JobSpec(b"e")])
    assert snapshot(sync_redis, ns, q) == before
    # a duplicate does not count: it is still answered as one
    (dup,) = await service.publish(route, ns, q, [JobSpec(b"a", job_id="a")])
    assert dup.duplicate
    assert snapshot(sync_redis, ns, q) == before
    # a republish replaces its job (room enough), one of a job not there adds one: refused
    await service.republish(route, ns, q, "a", JobSpec(b"a2", job_id="a2"))
    before = snapshot(sync_redis, ns, q)
    with pytest.raises(QueueFull):
        await service.republish(route, ns, q, "gone", JobSpec(b"z", job_id="z"))
    assert snapshot(sync_redis, ns, q) == before
    # room again once a job is gone
    (a,) = await service.consume(route, ns, [q], 30_000, 1, 0)
    await service.ack(route, ns, q, [a.job_id])
    await service.publish(route, ns, q, [JobSpec(b"e")])
    await service.configure(route, ns, q, [("max_size", "")])
    await service.publish(route, ns, q, [JobSpec(b"f")])
    check_queue(sync_redis, ns, q)


async def test_the_dead_letter_lists_jobs_with_their_own_backoff(
    service: Service, sync_redis: redis.Redis
) -> None:
    """A dead job whose record carries its own retry backoff (and attributes) is listed with
    its deliveries and attributes (found by tests/engine/test_model.py: the listing cut the record
    before the backoff section and could not decode it)."""
    route, ns, q = service.route("default"), "ctl", "dead-backoff"
    specs = [
        JobSpec(b"a", job_id="a", backoff=Backoff(1, 700)),
        JobSpec(b"b", job_id="b", backoff=Backoff(2, 300, 1_000), attributes={"k": "v"}),
    ]
    await service.publish(route, ns, q, specs)
    for job_id in ("a", "b"):
        await service.bury(route, ns, q, job_id, "why")
    page, _ = await service.dead_jobs(route, ns, q, None, 10)
    assert sorted((d.job_id, d.reason, d.deliveries, d.size) for d in page) == [
        ("a", "buried", 0, 1),
        ("b", "buried", 0, 1),
    ]
    assert [d.attributes for d in sorted(page, key=lambda d: d.job_id)] == [None, {"k": "v"}]
    await service.destroy(route, ns, q)


async def test_a_bulk_of_duplicates_is_not_refused_by_a_queue_over_its_max_size(
    service: Service, sync_redis: redis.Redis
) -> None:
    """Duplicates do not count, in a bulk as in a single publish, even when the queue holds
    more than a max_size lowered since (found by tests/engine/test_model.py)."""
    route, ns, q = service.route("default"), "ctl", "over"
    await service.publish(route, ns, q, [JobSpec(b"a", job_id="a"), JobSpec(b"b", job_id="b")])
    await service.configure(route, ns, q, [("max_size", "1")])
    before = snapshot(sync_redis, ns, q)
    (one,) = await service.publish(route, ns, q, [JobSpec(b"a", job_id="a")])
    both = await service.publish(
        route, ns, q, [JobSpec(b"a", job_id="a"), JobSpec(b"b", job_id="b")]
    )
    assert one.duplicate and all(p.duplicate for p in both)
    assert snapshot(sync_redis, ns, q) == before
    await service.configure(route, ns, q, [("max_size", "")])
    await service.destroy(route, ns, q)


async def test_a_bulk_schedule_batch_beyond_max_size_writes_nothing(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    cfg, ns, t = engine.config, "ctl", now_ms()
    await engine.run(ops.configure(engine.config, ns, "full-bulk", [("max_size", "2")]))
    jobs = [(b"job-%d" % i, t, 0, 1, 0, b"x") for i in range(3)]
    before = snapshot(sync_redis, ns, "full-bulk")
    with pytest.raises(QueueFull):
        await engine.run(
            ops.publish_bulk(cfg, [(ns, "other", jobs[:1]), (ns, "full-bulk", jobs)], t)
        )
    assert snapshot(sync_redis, ns, "full-bulk") == before
    assert sync_redis.hlen(QueueKeys(ns, "other").jobs) == 1  # another queue's batch stands
    assert await engine.run(ops.publish_bulk(cfg, [(ns, "full-bulk", jobs[:2])], t)) == [0]


async def test_concurrent_publishes_never_take_a_queue_beyond_its_max_size(
    service: Service, sync_redis: redis.Redis
) -> None:
    route, ns, q, limit = service.route("default"), "ctl", "race", 25
    await service.configure(route, ns, q, [("max_size", str(limit))])

    async def one(i: int) -> int:
        try:
            await service.publish(route, ns, q, [JobSpec(b"%d" % i)])  # grouped commits
            return 1
        except QueueFull:
            return 0

    async def bulk(i: int) -> int:
        try:
            await service.publish(route, ns, q, [JobSpec(b"b%d" % i) for _ in range(4)])
            return 4
        except QueueFull:
            return 0

    results = await asyncio.gather(*[one(i) for i in range(80)], *[bulk(i) for i in range(10)])
    sizes = await service.sizes(route, ns, q)
    written = sizes.ready + sizes.delayed + sizes.reserved + sizes.dead
    assert written == sum(results) <= limit
    assert written >= limit - 3  # refused only when full (a bulk of 4 may not fit the rest)
    check_queue(sync_redis, ns, q)


# -- retry backoff ------------------------------------------------------------------------

KINDS = st.sampled_from([0, 1, 2])


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kind=KINDS,
    base=st.integers(1, 10**7),
    cap=st.integers(0, 10**8),
    jitter_pm=st.integers(0, 1000),
    deliveries=st.integers(1, 70),
    r=st.floats(0, 1, exclude_max=True),
    per_queue=st.booleans(),
    released=st.booleans(),
)
def test_the_next_attempt_waits_exactly_the_backoff_rule(
    sync_redis: redis.Redis,
    kind: int,
    base: int,
    cap: int,
    jitter_pm: int,
    deliveries: int,
    r: float,
    per_queue: bool,
    released: bool,
) -> None:
    """An expired reservation (or a release without a delay) with tries left comes back at
    now + the rule (lua/lib/retry.lua and cluster_dq.backoff agree to the millisecond)."""
    engine = SyncEngine(sync_redis, EngineConfig(draw=lambda: r))
    ns, q, t = "bo", uuid.uuid4().hex[:12], 1_700_000_000_000
    qk = QueueKeys(ns, q)
    backoff = Backoff(kind, base, cap, jitter_pm)
    if per_queue:
        name = {0: "none", 1: "fixed", 2: "exponential"}[kind]
        engine.run(ops.configure(engine.config, ns, q, _changes(name, base, cap, jitter_pm)))
    rec = Record(t - 10, 0, 5, deliveries, 0, b"body", None, None if per_queue else backoff)
    member = id_to_member("job-1")
    # a job this delivery holds (the state a consume leaves): set up directly
    sync_redis.hset(qk.jobs, member, rec.pack())
    sync_redis.zadd(qk.reserved, {member: t + (10_000 if released else -1)})
    sync_redis.hset(qk.leases, member, b"L" * 8)
    if released:
        (state,) = engine.run(ops.release(engine.config, ns, q, ["job-1"], 0, t, nack=True))
    else:
        engine.run(ops.tick(engine.config, ns, q, t))
        state = JobState.DELAYED if sync_redis.zscore(qk.delayed, member) else JobState.READY
    # a release counts its delivery on the job: the rule sees the job's deliveries as recorded
    wait = wait_ms(kind, base, cap, jitter_pm, deliveries, draw(r, 0))
    if wait > 0:
        assert state is JobState.DELAYED
        # at the latest 2^48 - 1 ms (lua/lib/retry.lua's LATEST_DUE): an uncapped exponential
        # wait of a long base passes any due time a record holds
        assert sync_redis.zscore(qk.delayed, member) == min(t + wait, 2**48 - 1)
        assert sync_redis.zscore(qk.ready, member) is None
    else:
        assert state is JobState.READY
        assert sync_redis.zscore(qk.ready, member) is not None
    assert sync_redis.zscore(qk.reserved, member) is None
    check_queue(sync_redis, ns, q)
    engine.run(ops.destroy(engine.config, ns, q))
    sync_redis.delete(qk.conf)


def _changes(kind: str, base: int, cap: int, jitter_pm: int) -> list[tuple[str, str]]:
    body = {
        "backoff": kind,
        "backoff_ms": base,
        "backoff_cap_ms": cap,
        "backoff_jitter": jitter_pm / 1000,
    }
    if kind == "none":
        body = {"backoff": None}
    return queueconf.parse_changes(json.dumps(body).encode())


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=KINDS,
    base=st.integers(1, 10**7),
    cap=st.integers(0, 10**8),
    jitter_pm=st.integers(0, 1000),
    deliveries=st.integers(1, 70),
    r=st.floats(0, 1, exclude_max=True),
)
def test_the_backoff_rule(
    kind: int, base: int, cap: int, jitter_pm: int, deliveries: int, r: float
) -> None:
    """fixed = base; exponential = min(cap, base * 2^(deliveries-1)); jitter takes off up to
    its share; never more than the wait itself, never negative."""
    got = wait_ms(kind, base, cap, jitter_pm, deliveries, r)
    if kind == 0:
        assert got == 0
        return
    full = base if kind == 1 else base * 2 ** min(deliveries - 1, 40)
    if kind == 2 and cap:
        full = min(full, cap)
    assert full - full * jitter_pm / 1000 - 1 <= got <= full
    if jitter_pm == 0 or r == 0:
        assert got == full


async def test_an_expired_reservation_and_a_release_come_back_after_the_backoff(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    engine.config = dataclasses.replace(engine.config, draw=lambda: 0.0)
    clock = Clock(now_ms())
    engine.clock = clock  # type: ignore[method-assign]
    cfg, ns, q, t = engine.config, "bo", "life", clock.t
    await engine.run(
        ops.configure(engine.config, ns, q, _changes("exponential", 1_000, 3_000, 500))
    )  # the queue's rule
    await engine.run(ops.publish(cfg, ns, q, [JobSpec(b"x", tries=5)], t))
    (job,) = await engine.run(ops.consume(cfg, ns, [q], 1_000, 1, t))
    # the ttr runs out: deliveries 1 -> waits 1 s
    sizes = await engine.run(ops.tick(cfg, ns, q, t + 1_000))
    assert (sizes.ready, sizes.delayed, sizes.next_event_ms) == (0, 1, t + 2_000)
    peeked = await engine.run(ops.peek_job(ns, q, job.job_id))
    assert peeked is not None and peeked.state is JobState.DELAYED
    assert peeked.due_ms == t + 2_000
    assert await engine.run(ops.consume(cfg, ns, [q], 1_000, 1, t + 1_999)) == []
    (again,) = await engine.run(ops.consume(cfg, ns, [q], 10_000, 1, t + 2_000))
    assert again.deliveries == 2
    # released without a delay: deliveries 2 -> waits 2 s
    (state,) = await engine.run(
        ops.release(cfg, ns, q, [again.job_id], 0, t + 2_500, nack=True, leases=[again.lease])
    )
    assert state is JobState.DELAYED
    assert sync_redis.zscore(QueueKeys(ns, q).delayed, id_to_member(job.job_id)) == t + 4_500
    assert await engine.run(ops.consume(cfg, ns, [q], 1_000, 1, t + 4_499)) == []
    (third,) = await engine.run(ops.consume(cfg, ns, [q], 1_000, 1, t + 4_500))
    assert third.job_id == job.job_id and third.deliveries == 3
    # a job with its own rule ("none") comes back at once, whatever its queue's
    await engine.run(
        ops.publish(cfg, ns, q, [JobSpec(b"own", tries=2, backoff=Backoff(0))], t + 4_500)
    )
    (own,) = await engine.run(ops.consume(cfg, ns, [q], 1_000, 1, t + 4_500))
    (state,) = await engine.run(
        ops.release(cfg, ns, q, [own.job_id], 0, t + 4_600, nack=True, leases=[own.lease])
    )
    assert state is JobState.READY
    # nothing lost: both jobs are there, acked, and the queue is empty
    got = await engine.run(ops.consume(cfg, ns, [q], 1_000, 5, t + 4_600))
    assert [j.job_id for j in got] == [own.job_id]
    await engine.run(ops.ack(ns, q, [own.job_id, third.job_id], t + 4_700))
    s = await engine.run(ops.sizes(cfg, ns, q))
    assert (s.ready, s.delayed, s.reserved, s.dead) == (0, 0, 0, 0)
    check_queue(sync_redis, ns, q)


async def test_a_backoff_without_a_cap_never_sets_a_due_time_past_the_latest_one(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """The longest base (2^32 - 1 ms), no cap, the 41st delivery: base * 2^40 ms is about
    2^72, far past any due time a record or a reschedule can hold (2^48 - 1), and past what a
    double holds exactly. The job's next attempt is the latest due time instead."""
    engine.config = dataclasses.replace(engine.config, draw=lambda: 0.0)
    cfg, ns, q, t = engine.config, "bo", "far", now_ms()
    qk = QueueKeys(ns, q)
    backoff = Backoff(2, 2**32 - 1, 0, 0)
    rec = Record(t - 10, 0, 5, 41, 0, b"body", None, backoff)
    member = id_to_member("job-far")
    sync_redis.hset(qk.jobs, member, rec.pack())
    sync_redis.zadd(qk.reserved, {member: t + 10_000})
    sync_redis.hset(qk.leases, member, b"L" * 8)
    (state,) = await engine.run(ops.release(cfg, ns, q, ["job-far"], 0, t, nack=True))
    assert state is JobState.DELAYED
    assert sync_redis.zscore(qk.delayed, member) == 2**48 - 1
    peeked = await engine.run(ops.peek_job(ns, q, "job-far"))
    assert peeked is not None and peeked.due_ms == 2**48 - 1
    check_queue(sync_redis, ns, q)


@pytest.mark.parametrize("how", ["release", "consume"])
async def test_the_shard_schedule_learns_when_a_backoff_ends(
    engine: AsyncEngine, sync_redis: redis.Redis, how: str
) -> None:
    """The pump promotes a job waiting out its backoff on time even with no consumer: its
    shard's schedule holds the queue by the backoff's end. A release under a long ttr is the
    case that matters: the queue's next event was the reservation's end, much later."""
    engine.config = dataclasses.replace(engine.config, draw=lambda: 0.0)
    cfg, ns, q, t = engine.config, "bo", f"sched-{how}", now_ms()
    await engine.run(ops.configure(engine.config, ns, q, _changes("fixed", 2_000, 0, 0)))
    await engine.run(ops.publish(cfg, ns, q, [JobSpec(b"x", tries=3)], t))
    ttr = 600_000 if how == "release" else 1_000
    (job,) = await engine.run(ops.consume(cfg, ns, [q], ttr, 1, t))
    sk = ShardKeys(shard_of(f"{ns}/{q}", cfg.shards))
    if how == "release":
        await engine.run(ops.release(cfg, ns, q, [job.job_id], 0, t + 10, nack=True))
        due = t + 10 + 2_000
    else:  # the ttr runs out and a consume (of a long ttr) finds it
        await engine.run(ops.consume(cfg, ns, [q], 60_000, 1, t + 1_000))
        due = t + 1_000 + 2_000
    assert sync_redis.zscore(QueueKeys(ns, q).delayed, id_to_member(job.job_id)) == due
    scheduled = sync_redis.zscore(sk.schedule, f"{ns}/{q}")
    assert scheduled is not None and scheduled <= due


async def test_a_long_poll_is_woken_when_a_backoff_ends(service: Service) -> None:
    route, ns, q = service.route("default"), "bo", "wake"
    await service.configure(route, ns, q, _changes("fixed", 400, 0, 0))
    await service.publish(route, ns, q, [JobSpec(b"x", tries=3)])
    (job,) = await service.consume(route, ns, [q], 30_000, 1, 0)
    t = now_ms()
    assert await service.release(route, ns, q, job.job_id, 0, job.lease) is JobState.DELAYED
    async with asyncio.timeout(5):
        (back,) = await service.consume(route, ns, [q], 30_000, 1, 4_000)
    assert back.job_id == job.job_id and now_ms() >= t + 400


async def test_consumers_that_fail_first_tries_lose_and_duplicate_nothing_under_backoff(
    service: Service, sync_redis: redis.Redis
) -> None:
    """Many consumers at once: each job's first delivery is released (it waits out a jittered
    backoff in DELAYED, then long-polls are woken for it), its second is acked. Every job is
    acked exactly once; nothing is left behind."""
    route, ns, q, n = service.route("default"), "bo", "race", 40
    await service.configure(route, ns, q, _changes("exponential", 60, 200, 500))
    published = await service.publish(route, ns, q, [JobSpec(b"%d" % i, tries=3) for i in range(n)])
    ids = {p.job_id for p in published}
    acked: list[str] = []

    async def consumer() -> None:
        while len(acked) < n:
            jobs = await service.consume(route, ns, [q], 30_000, 1, 500)
            for job in jobs:
                if job.deliveries == 1:
                    state = await service.release(route, ns, q, job.job_id, 0, job.lease)
                    assert state is JobState.DELAYED
                else:
                    await service.ack(route, ns, q, [job.job_id], [job.lease])
                    acked.append(job.job_id)

    async with asyncio.timeout(60):
        await asyncio.gather(*[consumer() for _ in range(6)])
    assert sorted(acked) == sorted(ids)  # each once
    s = await service.sizes(route, ns, q)
    assert (s.ready, s.delayed, s.reserved, s.dead) == (0, 0, 0, 0)
    check_queue(sync_redis, ns, q)


# -- settings -----------------------------------------------------------------------------

BAD_SETTINGS = [
    b"not json",
    b"[]",
    b'{"nope": 1}',
    b'{"paused": 1}',
    b'{"ttr_ms": 0}',
    b'{"ttr_ms": "5"}',
    b'{"tries": 70000}',
    b'{"tries": true}',
    b'{"max_size": -1}',
    b'{"backoff": "linear"}',
    b'{"backoff_ms": 5}',
    b'{"backoff": "fixed"}',
    b'{"backoff": "fixed", "backoff_ms": 10, "backoff_jitter": 2}',
    b'{"backoff": null, "backoff_ms": 10}',
    b'{"max_size": 5, "tries": 0}',
]


@pytest.mark.parametrize("body", BAD_SETTINGS)
def test_bad_settings_are_refused_naming_the_field(body: bytes) -> None:
    with pytest.raises(BadRequest):
        queueconf.parse_changes(body)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from([*queueconf.FIELDS, "other"]),
        st.one_of(st.none(), st.booleans(), st.integers(-5, 2**54), st.text(max_size=5)),
    )
)
def test_settings_parse_or_refuse_never_crash(body: dict[str, Any]) -> None:
    try:
        changes = queueconf.parse_changes(json.dumps(body).encode())
    except BadRequest as e:
        assert str(e)
        return
    assert {f for f, _ in changes} <= {
        "paused",
        "ttr",
        "tries",
        "max_size",
        *queueconf.BACKOFF_FIELDS,
    }


# -- the HTTP routes ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_service(deployment: Deployment) -> Iterator[tuple[str, str]]:
    svc = serve(deployment.pool_settings(), CLUSTER_DQ_QUEUESETTINGSCACHESECOND="0")
    yield svc.base, svc.admin
    svc.stop(timeout=20)


@pytest.fixture
def http(own_service: tuple[str, str], sync_redis: redis.Redis) -> Iterator[httpx.Client]:
    base, admin = own_service  # the token after sync_redis flushed the deployment
    token = httpx.post(
        f"{admin}/token/ctl", params={"description": "test"}, auth=ADMIN_AUTH
    ).json()["token"]
    with httpx.Client(base_url=base, headers={"X-Token": token}, timeout=30) as client:
        yield client


def test_settings_routes_pause_resume_max_size_and_next_attempt_at(
    http: httpx.Client, sync_redis: redis.Redis
) -> None:
    q = uuid.uuid4().hex[:10]
    r = http.get(f"/api/ctl/{q}/settings")
    assert r.status_code == 200 and r.json()["paused"] is False and r.json()["max_size"] is None
    before = sync_redis.hgetall(QueueKeys("ctl", q).conf)
    for body in BAD_SETTINGS:
        r = http.patch(f"/api/ctl/{q}/settings", content=body)
        assert r.status_code == 400 and r.json()["error"], body
    assert sync_redis.hgetall(QueueKeys("ctl", q).conf) == before  # nothing changed
    r = http.patch(
        f"/api/ctl/{q}/settings",
        json={"max_size": 1, "tries": 4, "ttr_ms": 5000, "backoff": "fixed", "backoff_ms": 700},
    )
    assert r.status_code == 200, r.text
    assert r.json()["backoff"] == "fixed" and r.json()["tries"] == 4
    assert http.put(f"/api/ctl/{q}", content=b"a").status_code == 201
    full = http.put(f"/api/ctl/{q}", content=b"b")
    assert full.status_code == 429 and "full" in full.json()["error"]
    # the queue's defaults: tries 4, ttr 5 s
    assert http.post(f"/api/ctl/{q}/pause").json()["paused"] is True
    assert http.post(f"/api/ctl/{q}/pause").json()["paused"] is True
    assert http.get(f"/api/ctl/{q}").status_code == 404  # paused: nothing
    assert http.post(f"/api/ctl/{q}/resume").json()["paused"] is False
    job = http.get(f"/api/ctl/{q}").json()
    assert job["remain_tries"] == 3  # the queue's tries (4), one spent
    deadline = sync_redis.zscore(QueueKeys("ctl", q).reserved, id_to_member(job["job_id"]))
    assert deadline is not None and deadline <= now_ms() + 5_000  # the queue's ttr, not 120 s
    rel = http.post(f"/api/ctl/{q}/job/{job['job_id']}/release", params={"lease": job["lease"]})
    assert rel.json()["state"] == "delayed"
    seen = http.get(f"/api/ctl/{q}/job/{job['job_id']}").json()
    assert seen["state"] == "delayed" and seen["next_attempt_at"] > 0
    # the listing shows it
    listed = http.get("/api/ctl", params={"limit": 1000}).json()
    (mine,) = [x for x in listed["queues"] if x["queue"] == q]
    assert mine["delayed"] == 1 and mine["paused"] is False
    assert http.get("/api/ctl", params={"limit": 1001}).status_code == 400
    assert http.get("/api/ctl", params={"cursor": "a{b"}).status_code == 400


def test_pausing_a_queue_that_does_not_exist_is_a_404_that_writes_nothing(
    http: httpx.Client, sync_redis: redis.Redis
) -> None:
    """A typo must not "succeed" while the real queue keeps delivering. A queue is known while
    it holds a job (any state), settings of its own or a schedule; else a pause or resume is a
    404 naming it and writes nothing (no CONF left behind), unless asked for with create=1."""
    q = "typo" + uuid.uuid4().hex[:8]
    keys = QueueKeys("ctl", q)
    for verb in ("pause", "resume"):
        r = http.post(f"/api/ctl/{q}/{verb}")
        assert r.status_code == 404, r.text
        assert f"ctl/{q}" in r.json()["error"] and "create=1" in r.json()["error"]
        assert sync_redis.exists(*keys.all_fixed(), keys.schedules) == 0
    # pausing before the first publish, asked for: the first job waits
    r = http.post(f"/api/ctl/{q}/pause", params={"create": "1"})
    assert r.status_code == 200 and r.json()["paused"] is True, r.text
    assert http.put(f"/api/ctl/{q}", content=b"x").status_code == 201
    assert http.get(f"/api/ctl/{q}").status_code == 404  # paused: nothing delivered
    assert http.post(f"/api/ctl/{q}/resume").json()["paused"] is False  # known now
    assert http.get(f"/api/ctl/{q}").status_code == 200
    # known by its settings alone (no job yet), or by a schedule alone
    with_settings, with_schedule = "set" + uuid.uuid4().hex[:8], "sch" + uuid.uuid4().hex[:8]
    assert http.patch(f"/api/ctl/{with_settings}/settings", json={"tries": 2}).status_code == 200
    assert http.post(f"/api/ctl/{with_settings}/pause").json()["paused"] is True
    body = {"every_ms": 60_000, "paused": True}
    assert http.put(f"/api/ctl/{with_schedule}/schedules/s", json=body).status_code == 201
    assert http.post(f"/api/ctl/{with_schedule}/pause").json()["paused"] is True
    assert http.post(f"/api/ctl/{q}/pause", params={"create": "x"}).status_code == 400


def test_odd_digits_and_deep_nesting_are_400s_not_500s(
    http: httpx.Client, sync_redis: redis.Redis
) -> None:
    """Found documenting the routes for OpenAPI: backoff_ms took str.isdigit()'s word for it
    ("²" is a digit to it, and int() refuses it; int() also refuses 5,000 digits), and the
    settings body was parsed without catching RecursionError: each was a 500."""
    q = uuid.uuid4().hex[:10]
    for name in ("backoff_ms", "backoff_cap_ms"):
        for value in ("\u00b2", "1" * 5000):
            query = {"backoff": "fixed", "backoff_ms": "10", name: value}
            r = http.put(f"/api/ctl/{q}", params=query, content=b"x")
            assert r.status_code == 400 and name in r.json()["error"], (name, r.text)
    r = http.patch(f"/api/ctl/{q}/settings", content=b"[" * 50_000)
    assert r.status_code == 400 and "JSON object" in r.json()["error"], r.text
    assert sync_redis.hgetall(QueueKeys("ctl", q).conf) == {}
    assert http.get(f"/api/ctl/{q}/size").json()["size"] == 0


# -- the namespace's queue listing --------------------------------------------------------


async def test_the_listing_pages_every_existing_queue_exactly_once_while_queues_appear(
    service: Service,
) -> None:
    route, ns = service.route("default"), "lst"
    existing = [f"q{i:03d}" for i in range(40)]
    for q in existing:
        await service.publish(route, ns, q, [JobSpec(b"x")])
    await service.configure(route, ns, "q005", [("paused", "1")])
    stop = asyncio.Event()

    async def create() -> None:
        i = 0
        while not stop.is_set():
            await service.publish(route, ns, f"new{i:04d}", [JobSpec(b"y")])
            await service.publish(route, ns, f"q{i:03d}a", [JobSpec(b"y")])
            i += 1
            await asyncio.sleep(0)

    creator = asyncio.create_task(create())
    seen: list[str] = []
    cursor = ""
    try:
        while True:
            page, cursor = await service.list_queues(route, ns, cursor, 7)
            seen += [o.name for o, _ in page]
            for o, now in page:
                if o.name == "q005":
                    assert o.paused
                if o.name in existing:
                    assert o.sizes.ready == 1 and o.oldest_due_ms is not None
                    assert now >= o.oldest_due_ms
            if not cursor:
                break
    finally:
        stop.set()
        await creator
    assert len(seen) == len(set(seen))  # never twice
    assert set(existing) <= set(seen)  # every pre-existing one
    assert seen == sorted(seen)


async def test_a_queue_is_listed_while_it_has_settings_or_jobs(
    service: Service, deployment: Deployment
) -> None:
    """Settings written before a queue's first job (a tenant's limits set when it signs up)
    make it listed, as an empty queue, until the last of them goes: the queue's own settings
    and its groups' alike, set and removed at random, against what the listing must show."""
    route, ns = service.route("default"), f"cfg-{uuid.uuid4().hex[:6]}"
    rng = random.Random(7)
    queues, groups = ("a", "b", "c"), ("g1", "g2")
    own: dict[str, set[str]] = {q: set() for q in queues}  # the model: settings set, per queue
    held: set[str] = set()  # queues holding a job

    async def listed() -> dict[str, ops.QueueOverview]:
        page, _ = await service.list_queues(route, ns, "", 100)
        return {o.name: o for o, _ in page}

    for step in range(60):
        q = rng.choice(queues)
        kind = rng.choice(("queue", "group", "group", "job", "ack"))
        if kind == "queue":
            on = rng.random() < 0.5
            await service.configure(route, ns, q, [("max_size", "100" if on else "")])
            (own[q].add if on else own[q].discard)("max_size")
        elif kind == "group":
            g, field, on = rng.choice(groups), rng.choice(("p", "c")), rng.random() < 0.5
            changes = (
                ops.GroupChanges(paused=on)
                if field == "p"
                else ops.GroupChanges(concurrency=3)
                if on
                else ops.GroupChanges(clear_concurrency=True)
            )
            await service.configure_group(route, ns, q, g, changes)
            (own[q].add if on else own[q].discard)(f"{field}:{g}")
        elif kind == "job" and q not in held:
            await service.publish(route, ns, q, [JobSpec(b"x")])
            held.add(q)
        elif kind == "ack" and q in held:
            [job] = await service.consume(route, ns, [q], 60_000, 1, 0)
            await service.ack(route, ns, q, [job.job_id])
            held.discard(q)
        got = await listed()
        want = {q for q in queues if own[q] or q in held}
        # (a queue whose last job went stays in its shard's registry until the pump's sweep)
        assert want <= set(got) <= want | {q for q in queues if not own[q]}, (step, got, own)
        for name in set(got) - held:
            assert got[name].sizes.ready + got[name].sizes.reserved == 0, got[name]
    for q in queues:  # every setting removed: nothing left in the registries of settings
        await service.configure(route, ns, q, [("max_size", "")])
        for g in groups:
            changes = ops.GroupChanges(paused=False, clear_concurrency=True)
            await service.configure_group(route, ns, q, g, changes)
    with deployment.sync_client() as r:
        for q in queues:
            qk = QueueKeys(ns, q)
            key = ShardKeys(shard_of(qk.qualified, EngineConfig().shards)).configured
            assert not r.sismember(key, qk.qualified), q


def test_settings_without_a_backoff_are_carried_whole() -> None:
    """A queue's settings as written on the pool it moves to (``as_changes``): with no
    backoff, the other settings still go (before: "a removed backoff takes no parameters",
    and a migrating queue with, say, only a max_size carried nothing: its publishes failed)."""
    for own in (
        QueueSettings(tries=4, max_size=10),
        QueueSettings(paused=True, ttr_ms=5_000),
        QueueSettings(),
    ):
        changes = dict(own.as_changes())
        carried = QueueSettings.from_hash({k: v for k, v in changes.items() if v != ""})
        assert carried == own
