"""Deduplication on publish (a dedup key: simple, throttle, debounce) and the Idempotency-Key,
one script each call (lua/publish_keyed.lua), against a real redis-server on every topology,
with explicit clocks: concurrency, a lost reply and its repeat, and what ack, dead letter,
delete and destroy do to a key."""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine import control
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.steps import Eval
from cluster_dq.errors import BadRequest, IdempotencyMismatch, QueueFull, WrongState
from cluster_dq.keys import QueueKeys, ShardKeys, shard_of
from cluster_dq.models import JobSpec, JobState
from cluster_dq.testing.invariants import check_queue, queue_keys
from tests.support.lost_reply import first_reply_lost

NS, Q = "ns", "q"
SEC = 1000


def fp(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


async def keyed(
    engine: AsyncEngine,
    now: int,
    body: bytes = b"x",
    key: str | None = "k1",
    mode: str = "simple",
    ttl: int = 0,
    idem: str | None = None,
    specs: list[JobSpec] | None = None,
    **spec: Any,
) -> ops.KeyedPublished:
    dedup = ops.Dedup(key, mode, ttl) if key is not None else None
    ident = ops.Idempotency(idem, fp(body.decode() + repr(spec))) if idem else None
    jobs = specs if specs is not None else [JobSpec(body, **spec)]  # type: ignore[arg-type]
    op = ops.publish_keyed(engine.config, NS, Q, jobs, now, dedup, ident)
    return await engine.run(op, idempotent=True)  # as the service runs it


async def consume(engine: AsyncEngine, now: int, count: int = 1) -> list[ops.ById]:
    return await engine.run(ops.consume(engine.config, NS, (Q,), 30 * SEC, count, now))


async def sizes(engine: AsyncEngine) -> ops.Sizes:
    return await engine.run(ops.sizes(engine.config, NS, Q))


async def test_simple_answers_the_existing_job_until_it_is_acked(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    first = await keyed(engine, t, b"a")
    assert first.dedup == "new" and not first.replayed
    again = await keyed(engine, t + 1, b"b", delay_ms=5 * SEC)
    assert again.dedup == "existing"
    assert again.published[0].job_id == first.published[0].job_id
    assert again.published[0].state is JobState.READY
    (job,) = await consume(engine, t + 2)
    assert job.body == b"a"  # the second body was never written
    reserved = await keyed(engine, t + 3, b"c")  # reserved still holds the key
    assert (reserved.dedup, reserved.published[0].state) == ("existing", JobState.RESERVED)
    assert (await sizes(engine)).reserved == 1 and (await sizes(engine)).ready == 0
    check_queue(sync_redis, NS, Q)
    await engine.run(ops.ack(NS, Q, [job.job_id]))
    assert sync_redis.hlen(QueueKeys(NS, Q).notes) == 0  # the key left with its job
    after = await keyed(engine, t + 4, b"d")
    assert after.dedup == "new" and after.published[0].job_id != job.job_id
    check_queue(sync_redis, NS, Q)


async def test_simple_a_dead_job_frees_its_key_and_delete_leaves_nothing(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    first = await keyed(engine, t, tries=1)
    await consume(engine, t)
    await engine.run(ops.tick(engine.config, NS, Q, t + 31 * SEC))  # ttr out, no tries: dead
    assert (await sizes(engine)).dead == 1
    second = await keyed(engine, t + 32 * SEC)
    assert second.dedup == "new" and second.published[0].job_id != first.published[0].job_id
    check_queue(sync_redis, NS, Q)  # the key names the new job
    dead = await engine.run(ops.peek_job(NS, Q, first.published[0].job_id))
    assert dead is not None and dead.dedup_key == "k1"  # the key it was published under
    await engine.run(ops.delete_dead(NS, Q, 10))
    check_queue(sync_redis, NS, Q)
    assert (await keyed(engine, t + 33 * SEC)).dedup == "existing"  # the new job still holds it
    await engine.run(ops.ack(NS, Q, [second.published[0].job_id]))
    assert queue_keys(sync_redis, NS, Q) == []  # nothing of either key left behind


async def test_many_concurrent_publishes_under_one_key_leave_one_job(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    for mode, ttl in (("simple", 0), ("throttle", 60 * SEC), ("debounce", 0)):
        got = await asyncio.gather(
            *(keyed(engine, t, str(i).encode(), f"c-{mode}", mode, ttl) for i in range(40))
        )
        ids = {g.published[0].job_id for g in got}
        assert len(ids) == 1, mode
        assert sum(g.dedup == "new" for g in got) == 1, mode
    s = await sizes(engine)
    assert s.ready == 3
    check_queue(sync_redis, NS, Q)


async def test_throttle_holds_for_its_window_even_after_the_ack(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    first = await keyed(engine, t, mode="throttle", ttl=10 * SEC)
    (job,) = await consume(engine, t + 1)
    await engine.run(ops.ack(NS, Q, [job.job_id]))
    inside = await keyed(engine, t + 9_999, mode="throttle", ttl=10 * SEC)
    assert inside.dedup == "existing"
    assert inside.published[0].job_id == first.published[0].job_id
    assert inside.published[0].state is None  # acked: in no state
    assert (await sizes(engine)).ready == 0
    later = await keyed(engine, t + 10 * SEC, mode="throttle", ttl=10 * SEC)
    assert later.dedup == "new" and later.published[0].job_id != first.published[0].job_id
    k = QueueKeys(NS, Q)
    # a window is kept no longer than its end (the keys expire after the last one)
    assert 0 < sync_redis.pttl(k.keyed) and sync_redis.zcard(k.keyed_due) == 1
    check_queue(sync_redis, NS, Q)


async def test_throttle_windows_past_their_time_are_trimmed(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    for i in range(100):
        await keyed(engine, t, key=f"t{i}", mode="throttle", ttl=SEC)
    k = QueueKeys(NS, Q)
    assert sync_redis.hlen(k.keyed) == 100
    await keyed(engine, t + 2 * SEC, key="late", mode="throttle", ttl=SEC)
    assert sync_redis.hlen(k.keyed) == 100 - 64 + 1  # 64 trimmed per call
    await keyed(engine, t + 2 * SEC, key="later", mode="throttle", ttl=SEC)
    assert sync_redis.hlen(k.keyed) == 2
    assert sync_redis.zcard(k.keyed_due) == 2


async def test_debounce_replaces_the_waiting_job_and_pushes_it_out(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    first = await keyed(engine, t, b"v1", mode="debounce", delay_ms=5 * SEC)
    jid = first.published[0].job_id
    assert first.dedup == "new" and first.published[0].state is JobState.DELAYED
    second = await keyed(engine, t + 4 * SEC, b"v2", mode="debounce", delay_ms=5 * SEC)
    assert (second.dedup, second.published[0].job_id) == ("replaced", jid)
    assert not await consume(engine, t + 6 * SEC)  # its old due time passed: not due now
    (job,) = await consume(engine, t + 9 * SEC)
    assert (job.job_id, job.body) == (jid, b"v2")
    check_queue(sync_redis, NS, Q)
    with pytest.raises(WrongState) as refused:
        await keyed(engine, t + 9 * SEC + 1, b"v3", mode="debounce", delay_ms=5 * SEC)
    assert refused.value.state == JobState.RESERVED and refused.value.job_id == jid
    looked = await engine.run(ops.peek_job(NS, Q, jid))
    assert looked is not None and looked.body == b"v2"  # nothing written
    await engine.run(ops.ack(NS, Q, [jid]))
    assert (await keyed(engine, t + 10 * SEC, b"v4", mode="debounce")).dedup == "new"
    check_queue(sync_redis, NS, Q)


async def test_a_debounced_jobs_lateness_counts_from_its_last_due_time(
    engine: AsyncEngine, sync_redis: redis.Redis, tmp_path: Path
) -> None:
    """A debounce moves its job's due time out, while the job's id keeps the first: its
    lateness (the metric, the lifecycle log) counts from the due time it was delivered for,
    and a grouped one's, waiting in READY, shows that due time too."""
    from prometheus_client import REGISTRY

    from cluster_dq import metrics
    from cluster_dq.lifecycle import LifecycleLog

    log = LifecycleLog(tmp_path)

    t = now_ms()
    for group in (None, "g"):
        first = await keyed(engine, t, b"v1", mode="debounce", delay_ms=5 * SEC, group=group)
        jid = first.published[0].job_id
        await keyed(engine, t + 4 * SEC, b"v2", mode="debounce", delay_ms=5 * SEC, group=group)
        await engine.run(ops.tick(engine.config, NS, Q, t + 9 * SEC))
        looked = await engine.run(ops.peek_job(NS, Q, jid))
        assert looked is not None and looked.state is JobState.READY
        assert looked.due_ms == t + 9 * SEC  # (a grouped job's READY score is its fair turn)
        (job,) = await consume(engine, t + 9 * SEC + 250)
        name, labels = "cluster_dq_job_lateness_seconds_sum", {"namespace": NS, "queue": Q}
        before = REGISTRY.get_sample_value(name, labels) or 0.0
        metrics.Metrics().record_delivered([job], t + 9 * SEC + 250)
        assert (REGISTRY.get_sample_value(name, labels) or 0.0) - before == pytest.approx(0.25)
        log.delivered([job], t + 9 * SEC + 250)
        log.flush()
        event = json.loads(log.path.read_text().splitlines()[-1])
        assert (event["id"], event["due"]) == (jid, t + 9 * SEC)
        await engine.run(ops.ack(NS, Q, [jid]))
    check_queue(sync_redis, NS, Q)


async def test_a_debounced_job_moved_counts_its_lateness_from_its_new_due_time(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """A reschedule or a kick moves the due time a debounce's record carries (its lateness
    counts from it), and the record's other sections and body stay as they were."""
    t = now_ms()
    attrs = {"tenant": "t1"}
    made = await keyed(
        engine, t, b"body", mode="debounce", delay_ms=5 * SEC, attributes=attrs, group="g"
    )
    jid = made.published[0].job_id
    await engine.run(control.reschedule_job(engine.config, NS, Q, jid, t + 60 * SEC, t + 1))
    await engine.run(ops.tick(engine.config, NS, Q, t + 60 * SEC))
    (job,) = await consume(engine, t + 60 * SEC + 250)
    assert (job.scheduled_ms, job.body, job.attributes, job.group) == (
        t + 60 * SEC,
        b"body",
        attrs,
        "g",
    )
    await engine.run(ops.ack(NS, Q, [jid]))
    # rescheduled into the past: due from then, not from the time asked (0 would count decades)
    made = await keyed(engine, t, b"body", key="k2", mode="debounce", delay_ms=5 * SEC)
    jid = made.published[0].job_id
    await engine.run(control.reschedule_job(engine.config, NS, Q, jid, 0, t + 1))
    (job,) = await consume(engine, t + 2)
    assert job.job_id == jid and job.scheduled_ms == t + 1
    await engine.run(ops.ack(NS, Q, [jid]))
    # buried before any delivery, then kicked: its first delivery counts from the kick's time
    made = await keyed(engine, t, b"body", key="k3", mode="debounce", delay_ms=5 * SEC)
    jid = made.published[0].job_id
    await engine.run(control.bury(NS, Q, jid, "no", t + 1))
    await engine.run(control.kick(engine.config, NS, Q, jid, 2 * SEC, 1, 0, t + 70 * SEC))
    await engine.run(ops.tick(engine.config, NS, Q, t + 72 * SEC))
    (job,) = await consume(engine, t + 72 * SEC + 250)
    assert (job.job_id, job.deliveries, job.scheduled_ms) == (jid, 1, t + 72 * SEC)
    assert job.body == b"body"
    await engine.run(ops.ack(NS, Q, [jid]))
    # a respawn, and a redrive with a delay: the same
    for i, revive in enumerate(("respawn", "redrive")):
        made = await keyed(engine, t, b"body", key=f"r{i}", mode="debounce", delay_ms=5 * SEC)
        jid = made.published[0].job_id
        await engine.run(control.bury(NS, Q, jid, "no", t + 1))
        at = t + (80 + i) * SEC
        if revive == "respawn":
            await engine.run(ops.respawn(engine.config, NS, Q, 10, 0, at))
        else:
            await engine.run(
                control.redrive_dead(
                    engine.config, NS, Q, control.DeadFilter(), None, 10, SEC, 1, 0, at
                )
            )
        looked = await engine.run(ops.peek_job(NS, Q, jid))
        want = at if revive == "respawn" else at + SEC
        assert looked is not None and looked.scheduled_ms == want and looked.body == b"body"
        await engine.run(ops.ack(NS, Q, [jid]))
    check_queue(sync_redis, NS, Q)


async def test_a_keyed_jobs_dead_letter_shows_its_body_size_and_attributes(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """A job under a key carries its due time after its attributes (flag 16): the dead-letter
    listing, which reads the record's head and not its body, skips it."""
    t = now_ms()
    for i, mode in enumerate(("simple", "debounce")):
        attrs = {"tenant": f"t{i}"}
        made = await keyed(engine, t, b"body-7", key=f"k{i}", mode=mode, attributes=attrs)
        jid = made.published[0].job_id
        await engine.run(control.bury(NS, Q, jid, "no", t + 1))
    page, _ = await engine.run(control.dead_page(NS, Q, None, 10))
    assert [(d.size, d.attributes, d.published_ms) for d in page] == [
        (6, {"tenant": "t0"}, t),
        (6, {"tenant": "t1"}, t),
    ]
    check_queue(sync_redis, NS, Q)


async def test_debounce_of_a_ready_job_delays_it_again(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    first = await keyed(engine, t, b"v1", mode="debounce")
    assert first.published[0].state is JobState.READY
    second = await keyed(engine, t + 1, b"v2", mode="debounce", delay_ms=SEC, ttl_ms=60 * SEC)
    assert (second.dedup, second.published[0].state) == ("replaced", JobState.DELAYED)
    s = await sizes(engine)
    assert (s.ready, s.delayed) == (0, 1)
    assert not await consume(engine, t + 2)
    (job,) = await consume(engine, t + 1 + SEC)
    assert job.body == b"v2"
    check_queue(sync_redis, NS, Q)


@pytest.mark.parametrize(
    ("mode", "ttl", "idem"),
    [("simple", 0, None), ("throttle", SEC, None), ("debounce", 0, None), (None, 0, "lost")],
)
async def test_a_repeat_after_a_lost_reply_finds_its_own_job(
    engine: AsyncEngine, sync_redis: redis.Redis, mode: str | None, ttl: int, idem: str | None
) -> None:
    """Redis ran the call and its reply was lost: the engine repeats it with the same ids,
    which must be told as new (not as a duplicate of itself), one job made; its new queue is
    registered in its shard though the repeat found its job there (a ready job that never
    expires: no pump event, and no META for the reconcile sweep to find)."""
    with first_reply_lost(engine, "publish_keyed") as lost:
        got = await keyed(
            engine, now_ms(), key=mode and "lost", mode=mode or "", ttl=ttl, idem=idem, ttl_ms=0
        )
    assert lost
    assert got.dedup == (mode and "new")
    assert not got.published[0].duplicate
    assert not got.replayed  # its own answer, not a replay: the job was published by this call
    assert await engine.run(ops.queues_of_namespace(engine.config.shards, NS)) == [Q]
    s = await sizes(engine)
    assert s.ready == 1
    (job,) = await consume(engine, now_ms())
    assert job.job_id == got.published[0].job_id
    check_queue(sync_redis, NS, Q)


async def test_a_debounce_repeated_after_its_job_was_taken_answers_that_job(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """The reply of a debounce publish is lost and a consumer reserves the job it made before
    the engine repeats the call: the repeat finds its own job under the key, which it must not
    refuse as a debounce of a reserved job (a 409 saying nothing was changed)."""
    taken: list[str] = []

    async def take() -> None:
        taken.extend(j.job_id for j in await consume(engine, now_ms()))

    with first_reply_lost(engine, "publish_keyed", take):
        got = await keyed(engine, now_ms(), key="d", mode="debounce")
    assert len(taken) == 1
    assert got.dedup == "new" and not got.replayed
    assert got.published[0].job_id == taken[0] and not got.published[0].duplicate
    assert got.published[0].state is JobState.RESERVED
    s = await sizes(engine)
    assert (s.ready, s.reserved) == (0, 1)
    with pytest.raises(WrongState):  # another debounce under the key is still refused
        await keyed(engine, now_ms(), b"other", key="d", mode="debounce")
    check_queue(sync_redis, NS, Q)


@pytest.mark.parametrize(
    ("acked", "another"),
    [(False, False), (True, False), (True, True)],
    ids=["taken", "taken-and-acked", "then-another-job-under-the-key"],
)
async def test_a_debounce_that_replaced_a_job_repeated_after_it_was_taken_answers_replaced(
    engine: AsyncEngine, sync_redis: redis.Redis, acked: bool, another: bool
) -> None:
    """A debounce replaces the key's waiting job, its reply is lost, and a consumer reserves
    that job (with the new body) before the engine repeats the call: the repeat must answer the
    replacement it made, not refuse it as a debounce of a reserved job (a 409 saying nothing
    was changed, while the body it brought is being delivered). Found by the history test
    across a Cluster failover. ``acked``: the job is acked too before the repeat; the key holds
    nothing then, and the repeat must not make a second job with the body its first attempt
    already delivered. ``another``: then another debounce makes a new job under the key, which
    the repeat must neither refuse against (409) nor replace (the body twice)."""
    first = await keyed(engine, now_ms(), b"first", key="d", mode="debounce")
    held = first.published[0].job_id
    taken: list[ops.ById] = []

    async def take() -> None:
        taken.extend(await consume(engine, now_ms()))
        if acked:
            await engine.run(ops.ack(NS, Q, [j.job_id for j in taken], now_ms()))
        if another:
            await keyed(engine, now_ms(), b"other", key="d", mode="debounce")

    with first_reply_lost(engine, "publish_keyed", take):
        got = await keyed(engine, now_ms(), b"second", key="d", mode="debounce")
    assert [j.job_id for j in taken] == [held] and taken[0].body == b"second"
    assert got.dedup == "replaced" and not got.replayed
    assert got.published[0].job_id == held
    if not acked:
        assert got.published[0].state is JobState.RESERVED
        with pytest.raises(WrongState):  # another debounce under the key is still refused
            await keyed(engine, now_ms(), b"third", key="d", mode="debounce")
    elif another:  # the other job is left as it was: its own body, still waiting
        (other,) = await consume(engine, now_ms())
        assert other.job_id != held and other.body == b"other"
    else:
        s = await sizes(engine)
        assert (s.ready, s.delayed, s.reserved) == (0, 0, 0)  # no second job
        again = await keyed(engine, now_ms(), b"third", key="d", mode="debounce")
        assert again.dedup == "new" and again.published[0].job_id != held  # the key is free
    check_queue(sync_redis, NS, Q)


@pytest.mark.parametrize("mode", ["simple", "debounce"])
async def test_a_keyed_publish_that_made_its_job_repeated_after_another_took_the_key(
    engine: AsyncEngine, sync_redis: redis.Redis, mode: str
) -> None:
    """A simple or debounce publish finds its key free and makes a job; its reply is lost, and
    before the engine repeats the call a consumer takes and acks that job and another publish
    makes a new job under the key. The repeat is this call's, whose job was made: it must
    answer that job, new, and leave the other one alone (a debounce replaced it with the body
    already delivered, losing the other body; a simple publish answered it as existing)."""
    taken: list[ops.ById] = []

    async def take_ack_and_publish_another() -> None:
        taken.extend(await consume(engine, now_ms()))
        await engine.run(ops.ack(NS, Q, [j.job_id for j in taken], now_ms()))
        await keyed(engine, now_ms(), b"other", key="d", mode=mode)

    with first_reply_lost(engine, "publish_keyed", take_ack_and_publish_another):
        got = await keyed(engine, now_ms(), b"mine", key="d", mode=mode)
    assert len(taken) == 1 and taken[0].body == b"mine"
    assert (got.published[0].job_id, got.dedup) == (taken[0].job_id, "new")
    assert not got.published[0].duplicate and not got.replayed
    (other,) = await consume(engine, now_ms())  # the other job as it was made
    assert other.job_id != taken[0].job_id and other.body == b"other"
    check_queue(sync_redis, NS, Q)


@pytest.mark.parametrize("between", ["another-debounce", "taken-and-nacked"])
async def test_a_debounce_that_made_its_job_repeated_leaves_that_job_as_it_is_now(
    engine: AsyncEngine, sync_redis: redis.Redis, between: str
) -> None:
    """A debounce finds its key free and makes a job; its reply is lost, and before the
    engine's repeat the job changes while it still holds the key and waits: another debounce
    replaces its body, or a consumer takes it and nacks it with a backoff. The repeat found its
    own job waiting and replaced it again with the first attempt's record: the other body was
    lost (that client told "replaced"), the backoff undone and the tries reset. It must answer
    its job, new, and write nothing."""
    moved: list[ops.ById] = []

    async def move() -> None:
        if between == "another-debounce":
            await keyed(engine, now_ms(), b"other", key="d", mode="debounce", delay_ms=5 * SEC)
            return
        moved.extend(await consume(engine, now_ms()))
        await engine.run(
            ops.release(engine.config, NS, Q, [moved[0].job_id], 30 * SEC, now_ms(), nack=True)
        )

    with first_reply_lost(engine, "publish_keyed", move):
        got = await keyed(engine, now_ms(), b"mine", key="d", mode="debounce", tries=3)
    assert got.dedup == "new" and not got.published[0].duplicate
    if between == "another-debounce":
        (job,) = await consume(engine, now_ms() + 10 * SEC)
        assert (job.job_id, job.body) == (got.published[0].job_id, b"other")
    else:
        assert got.published[0].state is JobState.DELAYED
        assert await consume(engine, now_ms()) == []  # the nack's backoff holds
        (job,) = await consume(engine, now_ms() + 40 * SEC)
        assert (job.job_id, job.tries_left, job.deliveries) == (moved[0].job_id, 1, 2)
    check_queue(sync_redis, NS, Q)


async def test_two_debounces_in_one_call_repeated_leave_the_last_body(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """Two debounces under one key share a call (group commit): the first makes the job, the
    second replaces its body. The call's reply is lost and the engine repeats it: the first
    request found its own job waiting and replaced it again, so its body, not the last one,
    was delivered. The last body must win, as without the fault."""
    reqs = [
        ops.KeyedRequest([JobSpec(b, delay_ms=5 * SEC)], ops.Dedup("d", "debounce", 0), None)
        for b in (b"A", b"B")
    ]
    op = ops.publish_keyed_many(engine.config, NS, Q, reqs, now_ms())
    with first_reply_lost(engine, "publish_keyed") as lost:
        got = await engine.run(op, idempotent=True)
    assert lost
    assert [g.dedup for g in got] == ["new", "replaced"]  # type: ignore[union-attr]
    (job,) = await consume(engine, now_ms() + 10 * SEC, 5)
    assert job.body == b"B"
    check_queue(sync_redis, NS, Q)


@pytest.mark.parametrize("mode", ["simple", "throttle", "debounce"])
async def test_a_keyed_publish_without_a_job_is_refused_by_the_engine(
    engine: AsyncEngine, sync_redis: redis.Redis, mode: str
) -> None:
    """The engine's own callers (the CLI, the Spark pipeline) reach publish_keyed without the
    HTTP layer's checks: a request under a dedup key with no job failed inside the script (a
    Lua error, a 500 to whoever called it). It is a BadRequest, and nothing is written."""
    with pytest.raises(BadRequest):
        await keyed(engine, now_ms(), mode=mode, ttl=1_000 if mode == "throttle" else 0, specs=[])
    assert queue_keys(sync_redis, NS, Q) == []


def scheduled(r: redis.Redis, engine: AsyncEngine) -> tuple[float | None, int | None]:
    """The queue's time in its shard's schedule (when the pump looks at it next) and its
    META.next (its next event): the first must not be later than the second."""
    qk = QueueKeys(NS, Q)
    sk = ShardKeys(shard_of(qk.qualified, engine.config.shards))
    nxt = r.hget(qk.meta, "next")
    return r.zscore(sk.schedule, qk.qualified), int(nxt) if nxt is not None else None


@pytest.mark.parametrize("how", ["publish", "simple", "debounce"])
async def test_a_repeat_with_a_client_job_id_registers_the_queue_its_first_attempt_made(
    engine: AsyncEngine, how: str
) -> None:
    """A publish with the client's own job_id (plain, or under a dedup key) brings a queue into
    being with a ready job that never expires (no pump event, no META for the reconcile sweep
    to find), and its reply is lost. The repeat found the job (a duplicate; the key's holder)
    and sent no shard signal: the queue was never listed nor looked at by the pump. Found by
    review."""
    spec = JobSpec(b"a", job_id="client-1")
    if how == "publish":
        op: Any = ops.publish(engine.config, NS, Q, [spec], now_ms())
    else:
        op = ops.publish_keyed(engine.config, NS, Q, [spec], now_ms(), ops.Dedup("k", how), None)
    with first_reply_lost(engine, "publish" if how == "publish" else "publish_keyed") as lost:
        await engine.run(op, idempotent=True)
    assert lost
    assert await engine.run(ops.queues_of_namespace(engine.config.shards, NS)) == [Q]


async def signal_lost(engine: AsyncEngine, publish: Any) -> None:
    """Runs ``publish`` with its shard signal lost (its instance stopped before sending it)."""
    real_step = engine._step

    async def lose(step: Any) -> Any:
        return None if isinstance(step, Eval) and step.script == "signal" else await real_step(step)

    engine._step = lose  # type: ignore[method-assign]
    try:
        await publish
    finally:
        engine._step = real_step  # type: ignore[method-assign]


async def test_a_clients_retry_replayed_under_its_idempotency_key_registers_the_queue(
    engine: AsyncEngine,
) -> None:
    """A publish with an Idempotency-Key brings a queue into being, and its instance stops
    before it tells the shard (the signal lost); the client retries, its ids made up afresh, and
    is answered the kept answer. That replay told the shard nothing: the queue was never
    listed. Found by review."""
    await signal_lost(engine, keyed(engine, now_ms(), b"a", key=None, idem="i"))
    assert await engine.run(ops.queues_of_namespace(engine.config.shards, NS)) == []
    again = await keyed(engine, now_ms(), b"a", key=None, idem="i")
    assert again.replayed
    assert await engine.run(ops.queues_of_namespace(engine.config.shards, NS)) == [Q]


@pytest.mark.parametrize("how", ["idempotency-key", "simple", "throttle", "debounce"])
async def test_a_clients_later_retry_signals_the_first_attempts_event(
    engine: AsyncEngine, sync_redis: redis.Redis, how: str
) -> None:
    """The first attempt (a job due in 60 s) loses its shard signal; the client retries 5 s
    later, with an Idempotency-Key (replayed) or its own job_id (what any request with that id
    gets). The retry signalled its own event, the retry's time + 60 s, so the pump looked at the
    queue 5 s after the first attempt's job was due. Found by review."""
    t = now_ms()

    async def publish(at: int) -> Any:
        if how == "idempotency-key":
            return await keyed(engine, at, b"a", key=None, idem="i", delay_ms=60 * SEC)
        ttl = 120 * SEC if how == "throttle" else 0
        return await keyed(
            engine, at, b"a", key="d", mode=how, ttl=ttl, delay_ms=60 * SEC, job_id="c1"
        )

    await signal_lost(engine, publish(t))
    await publish(t + 5 * SEC)
    at, nxt = scheduled(sync_redis, engine)
    assert at is not None and nxt is not None and at <= nxt, (at, nxt)


@pytest.mark.parametrize("together", [False, True], ids=["alone", "in-one-call-with-its-maker"])
async def test_a_debounce_repeat_that_answers_its_replacement_signals_the_new_due_time(
    engine: AsyncEngine, sync_redis: redis.Redis, together: bool
) -> None:
    """A debounce brings the key's job from 60 s to 1 s, and its reply is lost; the repeat
    answers the replacement kept for it and sent no shard signal, so the pump looked at the
    queue at the old time, the job up to a minute late (until the reconcile sweep). Alone, or
    sharing its call with the request that made the job (group commit). Found by review."""
    t = now_ms()
    make = ops.KeyedRequest([JobSpec(b"x", delay_ms=60 * SEC)], ops.Dedup("d", "debounce"), None)
    move = ops.KeyedRequest([JobSpec(b"y", delay_ms=1 * SEC)], ops.Dedup("d", "debounce"), None)
    if not together:
        await engine.run(ops.publish_keyed_many(engine.config, NS, Q, [make], t))
    reqs = [make, move] if together else [move]
    with first_reply_lost(engine, "publish_keyed") as lost:
        op = ops.publish_keyed_many(engine.config, NS, Q, reqs, t + 1)
        got = await engine.run(op, idempotent=True)
    assert lost and got[-1].dedup == "replaced"  # type: ignore[union-attr]
    at, nxt = scheduled(sync_redis, engine)
    assert at is not None and nxt is not None and at <= nxt, (at, nxt)
    check_queue(sync_redis, NS, Q)


async def test_a_repeat_with_a_client_job_id_answered_another_job_registers_the_queue(
    engine: AsyncEngine,
) -> None:
    """A throttle publish with the client's job_id brings a queue into being and its reply is
    lost; its window ends and another publish opens one on a new job before the repeat, which
    answers its own job, a duplicate (its id is present: what any request with that id gets),
    and told the shard nothing: the queue was never listed. Found by the model's check of the
    shards."""

    async def another_window() -> None:
        await asyncio.sleep(0.05)
        await keyed(engine, now_ms(), b"other", key="t", mode="throttle", ttl=60_000)

    with first_reply_lost(engine, "publish_keyed", another_window) as lost:
        got = await keyed(engine, now_ms(), b"a", key="t", mode="throttle", ttl=40, job_id="c1")
    assert lost and got.dedup == "existing"
    assert (got.published[0].job_id, got.published[0].duplicate) == ("c1", True)
    assert await engine.run(ops.queues_of_namespace(engine.config.shards, NS)) == [Q]


@pytest.mark.parametrize("past", [False, True])
async def test_a_debounce_with_a_client_id_repeated_signals_the_new_due_time(
    engine: AsyncEngine, sync_redis: redis.Redis, past: bool
) -> None:
    """The same with a client's job_id, which names no one call: the repeat replaces the job
    again (what any request with that id gets), which lowers nothing the first attempt had not
    lowered, so it sent no signal either. Found by the model's check of the shard's schedule.
    ``past``: the repeat stamped after the due time the first attempt set (a repeat is stamped
    afresh) makes the job ready and lowered nothing, while META.next still held that time,
    never signalled; a replacement made ready while META.next is its due time reports it."""
    t = now_ms() - (10 * SEC if past else 0)  # (the requests' time; the repeat: the clock's)
    await keyed(engine, t, b"x", key="d", mode="debounce", delay_ms=60 * SEC)
    with first_reply_lost(engine, "publish_keyed") as lost:
        got = await keyed(engine, t + 1, b"y", key="d", mode="debounce", delay_ms=SEC, job_id="c1")
    assert lost and got.dedup == "replaced"
    assert got.published[0].state is (JobState.READY if past else JobState.DELAYED)
    at, nxt = scheduled(sync_redis, engine)
    assert at is not None and nxt is not None and at <= nxt, (at, nxt)
    check_queue(sync_redis, NS, Q)


async def test_a_fresh_debounce_made_ready_while_the_pump_holds_back_sends_no_signal(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """Only a replacement that may be a repeat signals: while consumers lag, the pump holds a
    due wheel bucket shut and looks again in 50 ms, META.next staying in the past. A fresh
    debounce made ready then must not pull the queue's schedule back (the pump would spin at
    the debounce rate). Found in review."""
    cfg = replace(engine.config, open_backlog=1)  # one ready job is a backlog
    eng = AsyncEngine(engine.client, cfg)
    qk = QueueKeys(NS, Q)
    sk = ShardKeys(shard_of(qk.qualified, cfg.shards))
    t = now_ms() - 120 * SEC
    await eng.run(ops.publish(cfg, NS, Q, [JobSpec(b"r")], t))  # ready: the backlog
    await eng.run(ops.publish(cfg, NS, Q, [JobSpec(b"w", delay_ms=60 * SEC)], t))  # wheel
    at = t + 60 * SEC
    looked = await eng.run(ops.tick(cfg, NS, Q, at))  # the bucket is due to open: held back
    assert int(sync_redis.hget(qk.meta, "next") or 0) <= at
    assert looked.next_event_ms == at + 50
    sync_redis.zadd(sk.schedule, {qk.qualified: at + 50})  # as the pump's reschedule writes it
    sync_redis.hdel(sk.pending, qk.qualified)
    for i in range(2):  # a new job, then its replacement: ids made up for each call
        op = ops.publish_keyed(
            cfg, NS, Q, [JobSpec(b"d%d" % i)], at + 1 + i, ops.Dedup("k", "debounce"), None
        )
        assert (await eng.run(op, idempotent=True)).dedup == ("new", "replaced")[i]
    assert sync_redis.zscore(sk.schedule, qk.qualified) == at + 50
    assert sync_redis.hget(sk.pending, qk.qualified) is None
    check_queue(sync_redis, NS, Q)


async def test_idempotency_key_answers_the_first_answer_and_writes_nothing(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    specs = [JobSpec(b"a"), JobSpec(b"b", delay_ms=60 * SEC)]
    first = await keyed(engine, t, key=None, idem="req-1", specs=specs)
    assert not first.replayed and first.dedup is None
    again = await keyed(engine, t + 1, key=None, idem="req-1", specs=specs)
    assert again.replayed
    assert [p.job_id for p in again.published] == [p.job_id for p in first.published]
    assert [p.state for p in again.published] == [JobState.READY, JobState.DELAYED]
    s = await sizes(engine)
    assert (s.ready, s.delayed) == (1, 1)
    with pytest.raises(IdempotencyMismatch):
        await keyed(engine, t + 2, b"other", key=None, idem="req-1")
    assert (await sizes(engine)).ready == 1
    # past the window the key is free again
    late = t + engine.config.idempotency_ms
    assert not (await keyed(engine, late, b"z", key=None, idem="req-1")).replayed
    check_queue(sync_redis, NS, Q)


async def test_idempotency_key_with_a_dedup_key_replays_the_dedup_answer(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    first = await keyed(engine, t, b"a", idem="r1")
    second = await keyed(engine, t + 1, b"b", idem="r2")
    assert (first.dedup, second.dedup) == ("new", "existing")
    (job,) = await consume(engine, t + 2)
    await engine.run(ops.ack(NS, Q, [job.job_id]))
    replay = await keyed(engine, t + 3, b"b", idem="r2")  # the key is free, the answer is kept
    assert replay.replayed and replay.dedup == "existing"
    assert replay.published[0].job_id == first.published[0].job_id
    assert (await sizes(engine)).ready == 0
    check_queue(sync_redis, NS, Q)


async def test_a_full_queue_is_refused_whole_and_not_remembered(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    await engine.run(ops.configure(engine.config, NS, Q, [("max_size", "1")]))
    with pytest.raises(QueueFull):
        await keyed(engine, t, key=None, idem="full", specs=[JobSpec(b"a"), JobSpec(b"b")])
    assert (await sizes(engine)).ready == 0
    assert (await keyed(engine, t, b"a", idem="full2")).dedup == "new"
    with pytest.raises(QueueFull):
        await keyed(engine, t, b"b", key="other", idem="full3")
    check_queue(sync_redis, NS, Q)


async def test_destroy_leaves_nothing_of_the_keys_behind(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    await keyed(engine, t, key="s", delay_ms=60 * SEC)
    await keyed(engine, t, key="t", mode="throttle", ttl=600 * SEC)
    await keyed(engine, t, key="d", mode="debounce", delay_ms=60 * SEC)
    await keyed(engine, t, key=None, idem="i")
    assert await engine.run(ops.destroy(engine.config, NS, Q)) == 4
    assert queue_keys(sync_redis, NS, Q) == []
    assert (await keyed(engine, t + 1, key="t", mode="throttle", ttl=SEC)).dedup == "new"


async def test_a_job_id_of_the_client_is_kept_and_distinct_from_the_key(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    first = await keyed(engine, t, job_id="mine-1")
    assert (first.dedup, first.published[0].job_id) == ("new", "mine-1")
    other = await keyed(engine, t, job_id="mine-2")
    assert (other.dedup, other.published[0].job_id) == ("existing", "mine-1")
    again = await keyed(engine, t, key="another", job_id="mine-1")  # the id is taken
    assert again.dedup == "existing" and again.published[0].duplicate
    check_queue(sync_redis, NS, Q)


async def test_a_job_id_of_the_client_repeated_under_its_key_is_a_duplicate(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """A client's job_id names no call: its repeat under the key it holds gets the answer any
    other request gets (duplicate, existing; replaced for a debounce), not that of a new job."""
    t = now_ms()
    first = await keyed(engine, t, job_id="mine-1")
    again = await keyed(engine, t + 1, job_id="mine-1")
    assert (first.dedup, first.published[0].duplicate) == ("new", False)
    assert (again.dedup, again.published[0].duplicate) == ("existing", True)
    assert again.published[0].job_id == "mine-1"
    v1 = await keyed(engine, t, b"v1", key="d", mode="debounce", job_id="deb-1", delay_ms=SEC)
    v2 = await keyed(engine, t + 1, b"v2", key="d", mode="debounce", job_id="deb-1")
    assert (v1.dedup, v2.dedup) == ("new", "replaced")
    assert v2.published[0].job_id == "deb-1" and not v2.published[0].duplicate
    job = await engine.run(ops.peek_job(NS, Q, "deb-1"))
    assert job is not None and job.body == b"v2"
    # with the job reserved, a repeat of its id is a duplicate too (not a 409: the job is its own)
    got = await consume(engine, t + 2, count=2)
    assert {j.job_id for j in got} == {"mine-1", "deb-1"}
    taken = await keyed(engine, t + 3, b"v3", key="d", mode="debounce", job_id="deb-1")
    assert (taken.dedup, taken.published[0].duplicate) == ("existing", True)
    assert taken.published[0].state is JobState.RESERVED
    # under an Idempotency-Key, a repeat with the same id is a replay, whatever made it
    idem = await keyed(engine, t + 4, b"i", key=None, idem="i-1", job_id="idem-1")
    replay = await keyed(engine, t + 5, b"i", key=None, idem="i-1", job_id="idem-1")
    assert (idem.replayed, replay.replayed) == (False, True)
    assert replay.published[0].job_id == "idem-1" and not replay.published[0].duplicate
    check_queue(sync_redis, NS, Q)


@pytest.mark.parametrize("how", ["acked", "present", "holder reserved"])
async def test_a_client_job_id_that_names_another_job_replaces_nothing_under_the_key(
    engine: AsyncEngine, sync_redis: redis.Redis, how: str
) -> None:
    """A publish whose job_id names a job that exists or was acked lately is a duplicate of it,
    whatever job holds its dedup key: a debounce replaced the holder with its body (the
    repeat of a lost publish put a body already delivered back over a newer one) or answered
    409 when the holder was reserved. Found by a hostile review: failed before (``replaced``
    and the holder's body overwritten; a 409)."""
    t = now_ms()
    debounce: dict[str, Any] = {"key": "d", "mode": "debounce"}
    if how == "present":  # evt-1 holds another key, and is waiting
        await keyed(engine, t, b"A", key="other", mode="debounce", job_id="evt-1", delay_ms=SEC)
    else:  # evt-1 made under the key, delivered and acked: its key is free again
        await keyed(engine, t, b"A", job_id="evt-1", **debounce)
        (got,) = await consume(engine, t + 1)
        await engine.run(ops.ack(NS, Q, [got.job_id]))
    newer = await keyed(engine, t + 2, b"B", delay_ms=SEC, **debounce)
    holder = newer.published[0].job_id
    assert newer.dedup == "new" and holder != "evt-1"
    if how == "holder reserved":
        (got,) = await consume(engine, t + 2 * SEC)
        assert got.job_id == holder
    again = await keyed(engine, t + 3, b"A", job_id="evt-1", **debounce)
    assert again.dedup == "existing"
    assert (again.published[0].job_id, again.published[0].duplicate) == ("evt-1", True)
    job = await engine.run(ops.peek_job(NS, Q, holder))
    assert job is not None and job.body == b"B"
    check_queue(sync_redis, NS, Q)


async def test_requests_sharing_one_call_are_each_done_as_if_alone(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """The group commit's call (publish_keyed_many): a later request sees what an earlier one
    wrote (two under one key: one job), and one request's refusal (another request's
    Idempotency-Key, a debounce of a reserved job, a full queue) is its own: the others are
    written, and nothing of it."""
    t = now_ms()
    await keyed(engine, t, b"held", key="busy", mode="debounce")
    await consume(engine, t)  # the debounce key's job is reserved now
    await keyed(engine, t, b"first", key=None, idem="pay-1")

    def req(body: bytes, key: str | None = None, mode: str = "simple", idem: str | None = None):
        dedup = ops.Dedup(key, mode, 0) if key else None
        ident = ops.Idempotency(idem, fp(body.decode() + repr({}))) if idem else None
        return ops.KeyedRequest([JobSpec(body)], dedup, ident)

    requests = [
        req(b"a", key="one"),
        req(b"b", key="one"),  # the same key: finds a's job
        req(b"other", idem="pay-1"),  # pay-1 came with another body: refused alone
        req(b"c", key="busy", mode="debounce"),  # its job is reserved: refused alone
        req(b"first", idem="pay-1"),  # the same request again: its first answer
        req(b"d", key="two"),
    ]
    got = await engine.run(ops.publish_keyed_many(engine.config, NS, Q, requests, t + 1))
    a, b, mismatch, forbidden, replay, d = got
    assert isinstance(a, ops.KeyedPublished) and a.dedup == "new"
    assert isinstance(b, ops.KeyedPublished) and b.dedup == "existing"
    assert b.published[0].job_id == a.published[0].job_id
    assert isinstance(mismatch, IdempotencyMismatch)
    assert isinstance(forbidden, WrongState)
    assert isinstance(replay, ops.KeyedPublished) and replay.replayed
    assert isinstance(d, ops.KeyedPublished) and d.dedup == "new"
    s = await sizes(engine)
    assert (s.ready, s.reserved) == (3, 1)  # first, a, d; the reserved one untouched
    check_queue(sync_redis, NS, Q)
    max_size = await engine.run(ops.configure(engine.config, NS, Q, [("max_size", "5")]))
    assert max_size.max_size == 5  # 4 jobs in all: room for one
    full = await engine.run(
        ops.publish_keyed_many(
            engine.config, NS, Q, [req(b"e", key="three"), req(b"f", key="four")], t + 2
        )
    )
    assert isinstance(full[0], ops.KeyedPublished) and isinstance(full[1], QueueFull)
    assert (await sizes(engine)).ready == 4
    check_queue(sync_redis, NS, Q)


async def test_a_shared_call_repeated_after_a_lost_reply_answers_each_request_as_new(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """The group commit's call ran and its reply was lost: the engine repeats it, and each
    request (a simple key, a debounce key, an Idempotency-Key, two under one key) is told as
    the first time, one job per key, nothing replayed."""

    def req(body: bytes, key: str | None, mode: str = "simple", idem: str | None = None) -> Any:
        ident = ops.Idempotency(idem, fp(body.decode())) if idem else None
        return ops.KeyedRequest([JobSpec(body)], ops.Dedup(key, mode, 0) if key else None, ident)

    requests = [
        req(b"a", "s"),
        req(b"b", "d", "debounce"),
        req(b"c", None, idem="i"),
        req(b"e", "s"),  # the same key as the first: its job
    ]
    with first_reply_lost(engine, "publish_keyed") as lost:
        got = await engine.run(
            ops.publish_keyed_many(engine.config, NS, Q, requests, now_ms()), idempotent=True
        )
    assert lost
    a, b, c, e = got
    assert isinstance(a, ops.KeyedPublished) and isinstance(b, ops.KeyedPublished)
    assert isinstance(c, ops.KeyedPublished) and isinstance(e, ops.KeyedPublished)
    assert (a.dedup, b.dedup, c.dedup, e.dedup) == ("new", "new", None, "existing")
    assert not any(x.replayed for x in (a, b, c, e))
    assert e.published[0].job_id == a.published[0].job_id
    assert (await sizes(engine)).ready == 3
    check_queue(sync_redis, NS, Q)


async def test_a_debounce_that_replaced_a_throttle_windows_job_holds_its_key(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """A debounce under K that replaces the job of K's throttle window gives that job K (a
    lookup names it): once the window ends, the next debounce under K replaces the same job
    instead of making a second one beside it."""
    t = now_ms()
    w = await keyed(engine, t, b"t", key="K", mode="throttle", ttl=SEC, delay_ms=60 * SEC)
    d1 = await keyed(engine, t + 1, b"v1", key="K", mode="debounce", delay_ms=60 * SEC)
    assert d1.dedup == "replaced" and d1.published[0].job_id == w.published[0].job_id
    job = await engine.run(ops.peek_job(NS, Q, d1.published[0].job_id))
    assert job is not None and job.dedup_key == "K"
    d2 = await keyed(engine, t + 2 * SEC, b"v2", key="K", mode="debounce", delay_ms=60 * SEC)
    check_queue(sync_redis, NS, Q)
    assert (await sizes(engine)).delayed == 1, "two waiting jobs under one debounce key"
    assert d2.dedup == "replaced" and d2.published[0].job_id == w.published[0].job_id


async def test_a_keyed_publish_registers_its_queue(engine: AsyncEngine) -> None:
    """A keyed publish into a new queue registers it in its shard, as a plain publish does,
    even when its job is ready and never expires (no pump event): the namespace lists it."""
    t = now_ms()
    await engine.run(ops.publish(engine.config, NS, "plain", [JobSpec(b"x", ttl_ms=0)], t))
    await keyed(engine, t, b"x", key="K", ttl_ms=0)
    names = await engine.run(ops.queues_of_namespace(engine.config.shards, NS))
    assert sorted(names) == ["plain", Q], names
