"""Every transition of the engine against a real redis-server, with explicit clocks.

Passing ``now`` to each operation lets a test step through minutes of queue time without
sleeping; the scripts never read Redis's clock.
"""

from __future__ import annotations

import dataclasses
import functools

import time

import pytest
import redis

from cluster_dq.backoff import Backoff
from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.errors import BadRequest, BodyTooLarge
from cluster_dq.keys import BUCKET_WIDTH_MS, QueueKeys
from cluster_dq.models import MAX_BODY, JobSpec, JobState, id_to_member, validate_spec
from cluster_dq.pools import check_redis
from cluster_dq.testing.invariants import check_queue, queue_keys
from tests.support.lost_reply import first_reply_lost

NS, Q = "ns", "q"
MIN = 60_000


async def publish(engine: AsyncEngine, now: int, *specs: JobSpec, q: str = Q) -> list[str]:
    out = await engine.run(ops.publish(engine.config, NS, q, list(specs), now))
    return [p.job_id for p in out]


async def consume(
    engine: AsyncEngine, now: int, ttr: int = 30_000, count: int = 1, queues: tuple[str, ...] = (Q,)
) -> list:  # type: ignore[type-arg]
    return await engine.run(ops.consume(engine.config, NS, queues, ttr, count, now))


async def sizes(engine: AsyncEngine, q: str = Q) -> ops.Sizes:
    return await engine.run(ops.sizes(engine.config, NS, q))


async def test_publish_ready_consume_ack_leaves_nothing(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    (jid,) = await publish(engine, t, JobSpec(b"hello", tries=3))
    assert (await sizes(engine)).ready == 1
    (job,) = await consume(engine, t + 5)
    assert (job.job_id, job.body, job.tries_left, job.deliveries) == (jid, b"hello", 2, 1)
    assert job.state is JobState.RESERVED
    assert (await sizes(engine)).reserved == 1
    assert await engine.run(ops.ack(NS, Q, [jid])) == [JobState.RESERVED]
    assert await engine.run(ops.ack(NS, Q, [jid])) == [None]
    check_queue(sync_redis, NS, Q)
    assert queue_keys(sync_redis, NS, Q) == []


async def test_a_publish_repeated_after_a_lost_reply_registers_its_new_queue(
    engine: AsyncEngine,
) -> None:
    """The first publish into a new queue ran and its reply was lost: the engine's repeat
    finds its own job there (a duplicate of the ids it made up) and must still register the
    queue in its shard. Its job is ready and never expires: no pump event, and no META for the
    reconcile sweep to find; unregistered, the namespace would never list the queue."""
    with first_reply_lost(engine, "publish") as lost:
        (got,) = await engine.run(
            ops.publish(engine.config, "ns", "q", [JobSpec(b"x", ttl_ms=0)], now_ms()),
            idempotent=True,
        )
    assert lost and not got.duplicate
    assert await engine.run(ops.queues_of_namespace(engine.config.shards, "ns")) == ["q"]


async def test_an_acked_id_published_again_is_a_duplicate_for_a_while(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """A publish retried after its reply was lost (a failover) must not bring back a job that
    was meanwhile delivered and acked: acked ids are remembered for ``remember_ms``."""
    t = now_ms()
    spec = JobSpec(b"once", job_id="order-42")
    (jid,) = await publish(engine, t, spec)
    (job,) = await consume(engine, t + 1)
    assert await engine.run(ops.ack(NS, Q, [jid], t + 2, remember_ms=300)) == [JobState.RESERVED]
    (again,) = await engine.run(ops.publish(engine.config, NS, Q, [spec], t + 3))
    assert again.duplicate and (await sizes(engine)).ready == 0
    # republish remembers the id it acks too; its new job is an ordinary one
    (other,) = await publish(engine, t + 4, JobSpec(b"two", job_id="order-43"))
    await engine.run(ops.republish(engine.config, NS, Q, other, JobSpec(b"three"), t + 5))
    (dup,) = await engine.run(
        ops.publish(engine.config, NS, Q, [JobSpec(b"two", job_id="order-43")], t + 6)
    )
    assert dup.duplicate and (await sizes(engine)).ready == 1
    assert 0 < sync_redis.pttl(QueueKeys(NS, Q).acked) <= engine.config.remember_acked_ms
    # forgotten after the window (the key expires on Redis's clock; later acks trim old ids)
    sync_redis.pexpire(QueueKeys(NS, Q).acked, 1)
    time.sleep(0.01)
    (fresh,) = await engine.run(ops.publish(engine.config, NS, Q, [spec], t + 10))
    assert not fresh.duplicate
    # a later ack drops ids older than the window, a bounded number per call
    for i in range(3):
        (x,) = await publish(engine, t + 20, JobSpec(b"x", job_id=f"old-{i}"))
        await engine.run(ops.ack(NS, Q, [x], t + 20, remember_ms=1_000))
    (y,) = await publish(engine, t + 2_000, JobSpec(b"y"))
    await engine.run(ops.ack(NS, Q, [y], t + 2_000, remember_ms=1_000))
    assert sync_redis.zrange(QueueKeys(NS, Q).acked, 0, -1) == [id_to_member(y)]
    # off: nothing remembered
    (z,) = await publish(engine, t + 3_000, JobSpec(b"z", job_id="order-44"))
    sync_redis.delete(QueueKeys(NS, Q).acked)
    await engine.run(ops.ack(NS, Q, [z], t + 3_000, remember_ms=0))
    assert not sync_redis.exists(QueueKeys(NS, Q).acked)
    check_queue(sync_redis, NS, Q)


async def test_delayed_job_is_never_early(engine: AsyncEngine, sync_redis: redis.Redis) -> None:
    t = now_ms()
    (jid,) = await publish(engine, t, JobSpec(b"x", delay_ms=1_500))
    assert await consume(engine, t + 1_499) == []
    (job,) = await consume(engine, t + 1_500)
    assert job.job_id == jid
    check_queue(sync_redis, NS, Q)


async def test_the_service_warns_of_a_redis_that_would_not_keep_a_bucket_compact(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """A stock Redis keeps a hash as a listpack up to 128 entries (hash-max-listpack-entries);
    beyond, a full wheel bucket turns into a hash table and its jobs cost ~45 % more memory."""
    stock = sync_redis.config_get("hash-max-listpack-entries")["hash-max-listpack-entries"]
    try:
        for entries, warned in ((128, True), (511, True), (512, False), (1024, False)):
            sync_redis.config_set("hash-max-listpack-entries", entries)
            warnings = await check_redis("default", engine.client)
            said = [w for w in warnings if "hash-max-listpack-entries" in w]
            assert bool(said) is warned, (entries, warnings)
            assert all(f"is {entries};" in w for w in said)
    finally:
        sync_redis.config_set("hash-max-listpack-entries", stock)


async def test_far_job_lives_in_a_wheel_bucket_without_per_job_index(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    ids = await publish(engine, t, *[JobSpec(b"b" * 64, delay_ms=10 * MIN) for _ in range(50)])
    k = QueueKeys(NS, Q)
    assert sync_redis.zcard(k.delayed) == 0 and sync_redis.hlen(k.jobs) == 0
    assert sync_redis.zcard(k.wheel) == 1
    (bucket,) = sync_redis.zrange(k.wheel, 0, -1)
    assert sync_redis.object("encoding", k.bucket(bucket.decode())) == b"listpack"
    assert (await sizes(engine)).delayed == 50
    job = await engine.run(ops.peek_job(NS, Q, ids[7]))
    assert job is not None and job.state is JobState.DELAYED and job.due_ms == t + 10 * MIN
    assert check_queue(sync_redis, NS, Q)["wheel"] == 50
    # The pump opens the bucket ahead of time, then promotes each job at its exact due ms.
    due = t + 10 * MIN
    before = await engine.run(
        ops.tick(engine.config, NS, Q, due - engine.config.open_lead_ms - BUCKET_WIDTH_MS)
    )
    assert before.delayed == 50
    await engine.run(ops.tick(engine.config, NS, Q, due - 100))
    assert sync_redis.zcard(k.wheel) == 0 and sync_redis.zcard(k.delayed) == 50
    check_queue(sync_redis, NS, Q)
    assert await consume(engine, due - 1) == []
    got = await consume(engine, due, count=100)
    assert sorted(j.job_id for j in got) == sorted(ids)
    check_queue(sync_redis, NS, Q)


async def test_full_bucket_spills_to_next_lane_and_stays_findable(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    engine.config = dataclasses.replace(engine.config, lane_capacity=8)
    t = now_ms()
    ids: list[str] = []
    for _ in range(10):
        ids += await publish(engine, t, *[JobSpec(b"x", delay_ms=MIN) for _ in range(7)])
    k = QueueKeys(NS, Q)
    lanes = sync_redis.zrange(k.wheel, 0, -1)
    assert len(lanes) > 1
    for b in lanes:
        assert sync_redis.hlen(k.bucket(b.decode())) <= 8
    counts = check_queue(sync_redis, NS, Q)
    assert counts["wheel"] + counts["delayed"] == 70
    for jid in ids:
        job = await engine.run(ops.peek_job(NS, Q, jid))
        assert job is not None and job.state is JobState.DELAYED
    assert sorted(s for s in await engine.run(ops.ack(NS, Q, ids))) == [JobState.DELAYED] * 70
    assert queue_keys(sync_redis, NS, Q) == []


async def test_ttr_expiry_redelivers_then_dead_letters(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    (jid,) = await publish(engine, t, JobSpec(b"x", tries=2))
    (j1,) = await consume(engine, t, ttr=1_000)
    assert j1.tries_left == 1
    assert await consume(engine, t + 999, ttr=1_000) == []  # held by one consumer within ttr
    (j2,) = await consume(engine, t + 1_000, ttr=1_000)  # ttr passed: delivered again
    assert (j2.job_id, j2.tries_left, j2.deliveries) == (jid, 0, 2)
    s = await engine.run(ops.tick(engine.config, NS, Q, t + 2_000))
    assert (s.ready, s.reserved, s.dead) == (0, 0, 1)
    dead = await engine.run(ops.peek(engine.config, NS, Q, "dead", t + 2_000))
    assert dead is not None and dead.job_id == jid and dead.deliveries == 2
    check_queue(sync_redis, NS, Q)
    # Dead jobs never expire (as in lmstfy)
    s = await engine.run(ops.tick(engine.config, NS, Q, t + 10 * 86_400_000))
    assert s.dead == 1
    assert await engine.run(ops.respawn(engine.config, NS, Q, 10, 60_000, t + 3_000)) == 1
    (j3,) = await consume(engine, t + 3_000)
    assert (j3.job_id, j3.tries_left, j3.expire_at_ms) == (jid, 0, t + 63_000)
    check_queue(sync_redis, NS, Q)


async def test_delete_dead_with_limit(engine: AsyncEngine, sync_redis: redis.Redis) -> None:
    t = now_ms()
    await publish(engine, t, *[JobSpec(str(i).encode()) for i in range(5)])
    await consume(engine, t, ttr=10, count=5)
    assert (await engine.run(ops.tick(engine.config, NS, Q, t + 10))).dead == 5
    assert await engine.run(ops.delete_dead(NS, Q, 3)) == 3
    assert (await sizes(engine)).dead == 2
    assert await engine.run(ops.delete_dead(NS, Q, 100)) == 2
    check_queue(sync_redis, NS, Q)
    assert queue_keys(sync_redis, NS, Q) == []


async def test_ttl_expiry_leaves_nothing_in_any_state(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    await publish(engine, t, JobSpec(b"ready", ttl_ms=1_000))
    await publish(engine, t, JobSpec(b"near", delay_ms=500, ttl_ms=1_000))
    await publish(engine, t, JobSpec(b"wheel", delay_ms=MIN, ttl_ms=MIN))  # ttl == delay
    await publish(engine, t, JobSpec(b"reserved", ttl_ms=1_000), q="other")
    await consume(engine, t, ttr=60_000, queues=("other",))
    for q in (Q, "other"):
        await engine.run(ops.tick(engine.config, NS, q, t + 2 * MIN))
        check_queue(sync_redis, NS, q)
        assert queue_keys(sync_redis, NS, q) == []


async def test_consume_drops_an_expired_job_instead_of_a_spurious_404(engine: AsyncEngine) -> None:
    t = now_ms()
    await publish(engine, t, JobSpec(b"old", ttl_ms=1_000))
    (fresh,) = await publish(engine, t + 10, JobSpec(b"new", ttl_ms=MIN))
    (job,) = await consume(engine, t + 2_000)  # lmstfy returns 404 here (stale handle first)
    assert job.job_id == fresh


async def test_client_ids_are_idempotent(engine: AsyncEngine, sync_redis: redis.Redis) -> None:
    t = now_ms()
    first = await engine.run(
        ops.publish(
            engine.config,
            NS,
            Q,
            [
                JobSpec(b"a", job_id="order-1"),
                JobSpec(b"b", job_id="order-2", delay_ms=MIN),
                JobSpec(b"a", job_id="order-1"),
            ],
            t,
        )
    )
    assert [(p.job_id, p.duplicate) for p in first] == [
        ("order-1", False),
        ("order-2", False),
        ("order-1", True),
    ]
    again = await engine.run(
        ops.publish(engine.config, NS, Q, [JobSpec(b"b", job_id="order-2")], t)
    )
    assert again[0].duplicate
    s = await sizes(engine)
    assert (s.ready, s.delayed) == (1, 1)
    job = await engine.run(ops.peek_job(NS, Q, "order-2"))
    assert job is not None and job.state is JobState.DELAYED and job.body == b"b"
    check_queue(sync_redis, NS, Q)


async def test_priority_then_due_order(engine: AsyncEngine) -> None:
    t = now_ms()
    low = await publish(engine, t, JobSpec(b"low1"), JobSpec(b"low2"))
    (high,) = await publish(engine, t + 1, JobSpec(b"high", priority=9))
    got = await consume(engine, t + 2, count=3)
    assert [j.job_id for j in got] == [high, *low]


async def test_multi_queue_consume_follows_listed_priority(engine: AsyncEngine) -> None:
    t = now_ms()
    (a,) = await publish(engine, t, JobSpec(b"a"), q="qa")
    (b,) = await publish(engine, t - 5, JobSpec(b"b"), q="qb")
    got = await consume(engine, t, queues=("qb", "qa"), count=1)
    assert [j.job_id for j in got] == [b]
    got = await consume(engine, t, queues=("qb", "qa"), count=5)
    assert [j.job_id for j in got] == [a]


async def test_multi_queue_consume_goes_straight_to_the_queues_with_work(
    engine: AsyncEngine,
) -> None:
    """A consume of q0..q7 looks at every queue in one round trip, then visits only those with
    something due, in the listed order: the last queue's job does not wait for a round trip
    per queue before it (the walk that made q7 of the load profile the latest)."""
    t = now_ms()
    names = [f"q{i}" for i in range(8)]
    (late,) = await publish(engine, t - 100, JobSpec(b"7", delay_ms=50), q="q7")  # due t - 50
    (mid,) = await publish(engine, t - 10, JobSpec(b"3"), q="q3")
    await publish(engine, t, JobSpec(b"later", delay_ms=60_000), q="q1")  # not due: not visited
    visited: list[str] = []  # the queues a consume script ran on
    firsts: list[ops.Step] = []  # each consume's first step

    async def drive(count: int) -> list[str]:
        op = ops.consume(engine.config, NS, names, 30_000, count, t)
        reply: object = None
        while True:
            try:
                step = op.send(reply)
            except StopIteration as done:
                return [j.job_id for j in done.value]
            if reply is None:
                firsts.append(step)
            calls = step if isinstance(step, tuple) else (step,)
            visited.extend(
                c.keys[0] for c in calls if isinstance(c, ops.Eval) and c.script == "consume"
            )
            reply = await engine.run(_replay(step))

    assert await drive(1) == [mid]  # q3 comes before q7 (priority)
    assert await drive(5) == [late]
    assert visited == [QueueKeys(NS, "q3").meta, QueueKeys(NS, "q7").meta]
    for first in firsts:  # one look at all eight queues, writing nothing
        assert isinstance(first, tuple) and len(first) == 16
        assert all(isinstance(c, ops.Cmd) and c.args[0] in ("EXISTS", "HGET") for c in first)


def _replay(step: ops.Step) -> ops.Op[object]:
    return (yield step)


async def test_batch_consume_and_batch_ack(engine: AsyncEngine, sync_redis: redis.Redis) -> None:
    t = now_ms()
    ids = await publish(engine, t, *[JobSpec(str(i).encode()) for i in range(64)])
    got = await consume(engine, t, count=100)
    assert [j.job_id for j in got] == ids
    states = await engine.run(ops.ack(NS, Q, ids))
    assert states == [JobState.RESERVED] * 64
    assert queue_keys(sync_redis, NS, Q) == []


async def test_republish_acks_and_publishes_atomically(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    (old,) = await publish(engine, t, JobSpec(b"v1"))
    await consume(engine, t)
    old_state, new = await engine.run(
        ops.republish(engine.config, NS, Q, old, JobSpec(b"v2", delay_ms=10 * MIN), t)
    )
    assert old_state is JobState.RESERVED and not new.duplicate
    assert await engine.run(ops.peek_job(NS, Q, old)) is None
    job = await engine.run(ops.peek_job(NS, Q, new.job_id))
    assert job is not None and job.body == b"v2" and job.state is JobState.DELAYED
    check_queue(sync_redis, NS, Q)


async def test_release_restores_the_try(engine: AsyncEngine, sync_redis: redis.Redis) -> None:
    t = now_ms()
    (jid,) = await publish(engine, t, JobSpec(b"x", tries=1))
    (j,) = await consume(engine, t)
    assert j.tries_left == 0
    assert await engine.run(ops.release(engine.config, NS, Q, [jid], 2_000, t)) == [
        JobState.DELAYED
    ]
    assert await engine.run(ops.release(engine.config, NS, Q, [jid], 0, t)) == [
        None
    ]  # not reserved
    assert await consume(engine, t + 1_999) == []
    (j,) = await consume(engine, t + 2_000)
    assert (j.tries_left, j.deliveries) == (0, 1)
    check_queue(sync_redis, NS, Q)


async def test_nack_counts_the_delivery_and_dead_letters_the_last_try(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    (a,) = await publish(engine, t, JobSpec(b"a", tries=2))
    (b,) = await publish(engine, t + 1, JobSpec(b"b", tries=1))
    (c,) = await publish(engine, t + 2, JobSpec(b"c", tries=5, ttl_ms=1_000))
    assert [j.job_id for j in await consume(engine, t + 3, count=3)] == [a, b, c]
    release = functools.partial(ops.release, engine.config, NS, Q, nack=True)
    assert await engine.run(release([a, b], 500, t + 10)) == [JobState.DELAYED, JobState.DEAD]
    assert await engine.run(release([c, a, "never-existed"], 0, t + 1_002)) == [
        "expired",
        None,
        None,
    ]
    assert await consume(engine, t + 509) == []
    (j,) = await consume(engine, t + 510)
    assert (j.job_id, j.tries_left, j.deliveries) == (a, 0, 2)  # the nacked delivery counted
    assert await engine.run(release([a], 0, t + 511)) == [JobState.DEAD]
    assert (await engine.run(ops.peek(engine.config, NS, Q, "dead", t + 512))).job_id == b  # type: ignore[union-attr]
    assert (await engine.run(ops.sizes(engine.config, NS, Q))).dead == 2
    check_queue(sync_redis, NS, Q)


@pytest.mark.parametrize("way", ["delay", "snooze", "backoff"])
async def test_a_job_released_past_its_ttl_is_expired_now_not_left_to_vanish(
    engine: AsyncEngine, sync_redis: redis.Redis, way: str
) -> None:
    """A release (or a snooze) whose delay, or whose retry backoff, ends at or after the job's
    ttl would leave it waiting to be dropped unseen: it is removed now and the reply says
    ``expired``. One that ends a millisecond before the ttl is delayed as asked."""
    t = now_ms()
    backoff = Backoff(1, 5_000, 0, 0) if way == "backoff" else None
    specs = [JobSpec(b"j", tries=3, ttl_ms=10_000, backoff=backoff) for _ in range(2)]
    ids = await publish(engine, t, *specs)
    assert len(await consume(engine, t, count=2)) == 2
    nack = way != "snooze"
    # released at t + 5_000 (backoff: 5 s) or with a delay of 5 s: due at the ttl's end
    delay = 0 if way == "backoff" else 5_000
    rel = functools.partial(ops.release, engine.config, NS, Q, nack=nack)
    assert await engine.run(rel([ids[0]], delay, t + 5_000)) == ["expired"]
    assert await engine.run(ops.peek_job(NS, Q, ids[0])) is None
    # a millisecond sooner: delayed, then delivered
    assert await engine.run(rel([ids[1]], delay, t + 4_999)) == [JobState.DELAYED]
    assert await consume(engine, t + 9_998) == []
    (j,) = await consume(engine, t + 9_999)
    assert j.job_id == ids[1]
    check_queue(sync_redis, NS, Q)


async def test_a_ttr_expiry_whose_backoff_passes_the_ttl_expires_the_job_now(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """As a release: a reservation that ran out, whose retry backoff would end at or after the
    job's ttl, removes the job (counted as expired), and one a millisecond sooner waits."""
    t = now_ms()
    spec = JobSpec(b"j", tries=3, ttl_ms=10_000, backoff=Backoff(1, 5_000, 0, 0))
    a, b = await publish(engine, t, spec, spec)
    assert len(await consume(engine, t, ttr=1_000, count=2)) == 2
    # the reservations ran out at t + 1_000; the one found at t + 4_999 waits until t + 9_999
    op = ops.touch(engine.config, NS, Q, b, 4_001, t + 999)
    assert await engine.run(op)  # b's ttr now ends at t + 5_000
    assert await consume(engine, t + 4_999) == []  # a: backoff to t + 9_999, before its ttl
    assert (await sizes(engine)).delayed == 1
    assert await consume(engine, t + 5_000) == []  # b: backoff to t + 10_000, its ttl's end
    assert await engine.run(ops.peek_job(NS, Q, b)) is None
    (j,) = await consume(engine, t + 9_999)
    assert j.job_id == a
    check_queue(sync_redis, NS, Q)


async def test_touch_moves_the_ttr_deadline_of_a_reserved_job_only(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    (jid,) = await publish(engine, t, JobSpec(b"x", tries=3))
    assert await engine.run(ops.touch(engine.config, NS, Q, jid, 60_000, t)) is False  # ready
    await consume(engine, t, ttr=1_000)
    assert await engine.run(ops.touch(engine.config, NS, Q, jid, 5_000, t + 900)) is True
    await engine.run(ops.tick(engine.config, NS, Q, t + 5_899))  # the old deadline passed
    assert (await engine.run(ops.peek_job(NS, Q, jid))).state is JobState.RESERVED  # type: ignore[union-attr]
    assert await engine.run(ops.touch(engine.config, NS, Q, jid, 100, t + 5_000)) is True  # shorter
    await engine.run(ops.tick(engine.config, NS, Q, t + 5_100))
    job = await engine.run(ops.peek_job(NS, Q, jid))
    assert job is not None and job.state is JobState.READY and job.tries_left == 2
    assert await engine.run(ops.touch(engine.config, NS, Q, "never-existed", 100, t)) is False
    check_queue(sync_redis, NS, Q)


async def test_peek_head_and_job_by_id_in_every_state(engine: AsyncEngine) -> None:
    t = now_ms()
    assert await engine.run(ops.peek(engine.config, NS, Q, "ready", t)) is None
    (r,) = await publish(engine, t, JobSpec(b"r", attributes={"k": "v"}))
    (d,) = await publish(engine, t, JobSpec(b"d", delay_ms=2_000))
    head = await engine.run(ops.peek(engine.config, NS, Q, "ready", t))
    assert head is not None and head.job_id == r and head.attributes == {"k": "v"}
    assert (await engine.run(ops.peek_job(NS, Q, r))).state is JobState.READY  # type: ignore[union-attr]
    assert (await engine.run(ops.peek_job(NS, Q, d))).state is JobState.DELAYED  # type: ignore[union-attr]
    await consume(engine, t)
    assert (await engine.run(ops.peek_job(NS, Q, r))).state is JobState.RESERVED  # type: ignore[union-attr]
    assert await engine.run(ops.peek_job(NS, Q, "no-such-job")) is None
    assert await engine.run(ops.peek_job(NS, Q, "01M80P4A6S000B66SZEKP575YD")) is None


async def test_destroy_removes_every_state_and_many_buckets(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    for i in range(150):  # 150 distinct wheel buckets: more than one destroy step
        await publish(engine, t, JobSpec(b"w", delay_ms=MIN + i * BUCKET_WIDTH_MS))
    await publish(engine, t, JobSpec(b"near", delay_ms=1_000), JobSpec(b"r1"), JobSpec(b"r2"))
    await consume(engine, t)
    await publish(engine, t, JobSpec(b"dead", tries=1), q="x")
    deleted = await engine.run(ops.destroy(engine.config, NS, Q))
    assert deleted == 153
    assert queue_keys(sync_redis, NS, Q) == []
    assert (await sizes(engine)) == ops.Sizes(0, 0, 0, 0, None)


def test_bad_specs_are_refused_naming_the_parameter() -> None:
    cases = [
        (JobSpec(b"", delay_ms=-1), "delay"),
        (JobSpec(b"", ttl_ms=-5), "ttl"),
        (JobSpec(b"", delay_ms=2_000, ttl_ms=1_000), "ttl"),
        (JobSpec(b"", tries=0), "tries"),
        (JobSpec(b"", tries=65_536), "tries"),
        (JobSpec(b"", priority=256), "priority"),
        (JobSpec(b"", attributes={str(i): "v" for i in range(17)}), "attributes"),
        (JobSpec(b"", attributes={"k" * 33: "v"}), "attributes"),
        (JobSpec(b"", job_id="has space"), "job_id"),
        (JobSpec(b"", job_id="01M80P4A6S000B66SZEKP575YD"), "job_id"),
    ]
    for spec, param in cases:
        with pytest.raises(BadRequest) as e:
            validate_spec(spec)
        assert e.value.parameter == param, spec
    with pytest.raises(BodyTooLarge):
        validate_spec(JobSpec(b"x" * (MAX_BODY + 1)))
    validate_spec(JobSpec(b"x" * MAX_BODY, delay_ms=5, ttl_ms=6, tries=65_535))


async def test_tick_holds_buckets_back_while_consumers_lag(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    engine.config = dataclasses.replace(engine.config, open_backlog=100, lane_capacity=50)
    t = now_ms()
    for _ in range(10):
        await publish(engine, t, *[JobSpec(b"x", delay_ms=MIN) for _ in range(50)])
    due = t + MIN
    s = await engine.run(ops.tick(engine.config, NS, Q, due))
    # one open call (4 lanes of 50) reaches the backlog of 100: the rest stays compact
    assert (s.ready, s.delayed) == (200, 300)
    assert s.next_event_ms is not None and s.next_event_ms > due
    taken = 0
    for step in range(40):
        taken += len(await consume(engine, due + step, count=100))
        await engine.run(ops.tick(engine.config, NS, Q, due + step))
    assert taken == 500
    check_queue(sync_redis, NS, Q)


async def test_a_publish_during_a_pump_step_is_not_lost(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """The pump claims a queue and computes its next event; a publish with an earlier event
    lands in between; the reschedule must keep the earlier wake-up."""
    from cluster_dq.keys import ShardKeys, shard_of

    cfg = engine.config
    t = now_ms()
    shard = shard_of(f"{NS}/{Q}", cfg.shards)
    sched = ShardKeys(shard).schedule
    await publish(engine, t, JobSpec(b"far", delay_ms=60 * MIN))  # wheel: wake-up in ~1 h
    sync_redis.zadd(sched, {f"{NS}/{Q}": t})  # pretend it is due now
    epoch = await engine.run(ops.lead(shard, "me", 30_000))
    assert await engine.run(ops.claim(shard, t, 10, 30_000, epoch)) == [f"{NS}/{Q}"]
    step = await engine.run(ops.tick(cfg, NS, Q, t))  # next event: the far bucket
    assert step.next_event_ms is not None and step.next_event_ms > t + 30 * MIN
    (near,) = await publish(engine, t, JobSpec(b"soon", delay_ms=2 * MIN))  # lands mid-step
    await engine.run(ops.reschedule(shard, f"{NS}/{Q}", step.next_event_ms, epoch))
    wake = sync_redis.zscore(sched, f"{NS}/{Q}")
    assert wake is not None and wake <= t + 2 * MIN - cfg.open_lead_ms
    check_queue(sync_redis, NS, Q)


async def test_polling_consumer_needs_no_pump_for_wheel_jobs(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """With no pump running (failover, takeover, a publisher that died before signalling its
    shard), a plain consume still opens the due bucket and gets the job, never early."""
    t = now_ms()
    (jid,) = await publish(engine, t, JobSpec(b"w", delay_ms=10 * MIN))
    due = t + 10 * MIN
    assert await consume(engine, due - 1) == []
    (job,) = await consume(engine, due)
    assert job.job_id == jid
    check_queue(sync_redis, NS, Q)
