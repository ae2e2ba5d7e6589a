"""Defects found by trying the engine as a user (and a hostile one) would. Each test here
failed before the fix that came with it; faults are injected around one attempt of one step
(``AsyncEngine._step``), Redis itself is real."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import Eval, Step
from cluster_dq.engine.publish import publish_call
from cluster_dq.errors import BadRequest
from cluster_dq.keys import QueueKeys
from cluster_dq.models import JobSpec, JobState, validate_spec
from cluster_dq.pump import Pump
from cluster_dq import waiters
from cluster_dq.waiters import WaiterHub
from cluster_dq.testing.invariants import check_queue

NS, Q = "ns", "q"


class Clock:
    """The engine's clock under the test's control."""

    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def inject(
    engine: AsyncEngine, fault: Callable[[Step, Callable[[Step], Awaitable[Any]]], Awaitable[Any]]
) -> None:
    """Wraps one attempt of one step: ``fault(step, real_step)`` decides what happens."""
    real = engine._step

    async def step(s: Step) -> Any:
        return await fault(s, real)

    engine._step = step  # type: ignore[method-assign]


def script_of(step: Step) -> str | None:
    return step.script if isinstance(step, Eval) else None


async def test_republish_with_the_same_client_id_replaces_the_job(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """PUT /api/ns/q/job/order-42?job_id=order-42 answered 201 and left nothing: the new job
    was taken for a duplicate of the id it was acking."""
    cfg, t = engine.config, now_ms()
    await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"v1", job_id="order-42")], t))
    await engine.run(ops.consume(cfg, NS, [Q], 30_000, 1, t + 1))
    old, new = await engine.run(
        ops.republish(cfg, NS, Q, "order-42", JobSpec(b"v2", job_id="order-42"), t + 2)
    )
    assert old is JobState.RESERVED and not new.duplicate and new.state is JobState.READY
    job = await engine.run(ops.peek_job(NS, Q, "order-42"))
    assert (
        job is not None
        and job.body == b"v2"
        and job.state is JobState.READY
        and job.deliveries == 0
    )
    check_queue(sync_redis, NS, Q)


def test_a_ttl_that_ends_when_the_job_is_due_is_refused() -> None:
    """``delay=1&ttl=1`` was accepted, and the job expired the moment it became due."""
    for delay_ms, ttl_ms in ((1000, 1000), (1, 1), (5000, 4999)):
        with pytest.raises(BadRequest, match="ttl"):
            validate_spec(JobSpec(b"x", delay_ms=delay_ms, ttl_ms=ttl_ms))
    validate_spec(JobSpec(b"x", delay_ms=1000, ttl_ms=1001))
    validate_spec(JobSpec(b"x", delay_ms=1000, ttl_ms=0))  # 0 = never expires


async def test_a_refused_consume_repeated_later_reserves_for_a_full_ttr(
    engine: AsyncEngine,
) -> None:
    """A consume refused by a stale master (nothing ran) is repeated after the retry policy's
    waits; it reused the first attempt's time, so the reservation ended in the past and a
    second consumer got the job at once."""
    cfg, clock = engine.config, Clock(now_ms())
    engine.clock = clock
    await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"x", tries=3)], clock()))
    refused: list[int] = []

    async def refuse_once(step: Step, real: Callable[[Step], Awaitable[Any]]) -> Any:
        if script_of(step) == "consume" and not refused:
            refused.append(1)
            clock.t += 10_000  # the retry policy waited while the failover went on
            raise ResponseError("NOREPLICAS Not enough good replicas to write.")
        return await real(step)

    inject(engine, refuse_once)
    (job,) = await engine.run(ops.consume(cfg, NS, [Q], 2_000, 1, clock()))
    assert refused and job.tries_left == 2
    clock.t += 1_000  # well within the 2-s ttr of the reservation actually made
    assert await engine.run(ops.consume(cfg, NS, [Q], 2_000, 1, clock())) == []


async def test_a_retried_touch_extends_from_when_it_ran(engine: AsyncEngine) -> None:
    cfg, clock = engine.config, Clock(now_ms())
    engine.clock = clock
    (p,) = await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"x", tries=3)], clock()))
    await engine.run(ops.consume(cfg, NS, [Q], 2_000, 1, clock()))
    failed: list[int] = []

    async def fail_once(step: Step, real: Callable[[Step], Awaitable[Any]]) -> Any:
        if script_of(step) == "touch" and not failed:
            failed.append(1)
            clock.t += 1_500  # connection reset; the policy waits and sends again
            raise RedisConnectionError("reset before sending")
        return await real(step)

    inject(engine, fail_once)
    assert await engine.run(ops.touch(cfg, NS, Q, p.job_id, 2_000, clock()), idempotent=True)
    clock.t += 1_000  # 2.5 s after the consume, 1 s after the touch ran: still held
    assert await engine.run(ops.consume(cfg, NS, [Q], 2_000, 1, clock())) == []


@pytest.mark.parametrize("when", ["consume", "publish"])
async def test_a_lost_shard_signal_does_not_fail_the_operation(
    engine: AsyncEngine, when: str
) -> None:
    """The signal that tells the pump about a queue's next event is a separate step. When it
    failed, a consume that had reserved jobs raised: the jobs were never handed out and a try
    was burnt. (A lost signal is repaired by the reconcile sweep.)"""
    cfg, t = engine.config, now_ms()
    if when == "consume":
        await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"x", tries=3)], t))

    async def no_signals(step: Step, real: Callable[[Step], Awaitable[Any]]) -> Any:
        if script_of(step) == "signal":
            raise RedisConnectionError("signal lost")
        return await real(step)

    inject(engine, no_signals)
    if when == "consume":
        (job,) = await engine.run(ops.consume(cfg, NS, [Q], 30_000, 1, t + 1))
        assert job.tries_left == 2
    else:
        (p,) = await engine.run(
            ops.publish(cfg, NS, Q, [JobSpec(b"x", delay_ms=60_000)], t), idempotent=True
        )
        assert not p.duplicate and p.state is JobState.DELAYED


async def test_a_settings_change_is_made_and_answered_when_its_listing_cannot_be_written(
    engine: AsyncEngine,
) -> None:
    """The listing of queues with settings is written after the change, in the shard's slot
    (another node on a Cluster): when that write fails, the change stands and is answered
    (it raised, a 503 for a change that was made)."""
    cfg, t = engine.config, now_ms()

    async def no_listing(step: Step, real: Callable[[Step], Awaitable[Any]]) -> Any:
        if script_of(step) == "listed":
            raise RedisConnectionError("shard unreachable")
        return await real(step)

    inject(engine, no_listing)
    got = await engine.run(ops.configure(cfg, NS, Q, [("max_size", "7")]), idempotent=True)
    assert got.max_size == 7
    changes = ops.GroupChanges(concurrency=2)
    g = await engine.run(ops.configure_group(cfg, NS, Q, "g", changes, t), idempotent=True)
    assert g.concurrency == 2


async def test_touch_cannot_revive_a_reservation_whose_ttr_ran_out(engine: AsyncEngine) -> None:
    cfg, t = engine.config, now_ms()
    (p,) = await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"x", tries=3)], t))
    await engine.run(ops.consume(cfg, NS, [Q], 1_000, 1, t))
    assert not await engine.run(ops.touch(cfg, NS, Q, p.job_id, 60_000, t + 1_001))
    (again,) = await engine.run(ops.consume(cfg, NS, [Q], 1_000, 1, t + 1_002))  # it is back
    assert again.job_id == p.job_id and again.deliveries == 2


async def test_acked_ids_are_remembered_for_the_configured_time_only(engine: AsyncEngine) -> None:
    """Lookups ignored the ack time, and each later ack pushed the memory's expiry back, so
    on a busy queue an id stayed unpublishable far longer than configured."""
    cfg, t = dataclasses.replace(engine.config, remember_acked_ms=1_000), now_ms()
    spec = JobSpec(b"x", job_id="order-7")
    await engine.run(ops.publish(cfg, NS, Q, [spec], t))
    await engine.run(ops.ack(NS, Q, ["order-7"], t + 1, remember_ms=1_000))
    (dup,) = await engine.run(ops.publish(cfg, NS, Q, [spec], t + 500))
    assert dup.duplicate
    await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"y", job_id="other")], t + 600))
    await engine.run(ops.ack(NS, Q, ["other"], t + 900, remember_ms=1_000))  # keeps the key alive
    (fresh,) = await engine.run(ops.publish(cfg, NS, Q, [spec], t + 1_100))
    assert not fresh.duplicate
    assert await engine.run(ops.known_ids(NS, Q, ["order-7", "other"], t + 1_100, 1_000)) == [
        True,
        True,
    ]
    assert await engine.run(ops.known_ids(NS, Q, ["other"], t + 2_000, 1_000)) == [False]


async def test_a_repeated_give_back_leaves_another_consumers_reservation_alone(
    engine: AsyncEngine,
) -> None:
    """The long-poll hub gives back jobs a consumer never got. Its release was repeated after
    a lost reply; by then another consumer held the job, and the repeat took it away from
    them (and restored a try)."""
    cfg, t = engine.config, now_ms()
    hub = WaiterHub(engine)
    try:
        await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"x", tries=3)], t))
        (mine,) = await engine.run(ops.consume(cfg, NS, [Q], 30_000, 1, now_ms()))
        theirs: list[Any] = []

        async def lose_the_reply(step: Step, real: Callable[[Step], Awaitable[Any]]) -> Any:
            reply = await real(step)
            if script_of(step) == "release" and not theirs:
                theirs.extend(await real(Eval("consume", *_consume_args(engine, now_ms()))))
                raise RedisConnectionError("reply lost")
            return reply

        inject(engine, lose_the_reply)
        await hub.give_back(NS, [mine])
        del engine._step
        assert len(theirs) > 5, "the other consumer reserved the job"
        s = await engine.run(ops.sizes(cfg, NS, Q))
        assert (s.ready, s.reserved) == (0, 1)
        held = await engine.run(ops.peek_job(NS, Q, mine.job_id))
        assert held is not None and held.state is JobState.RESERVED and held.tries_left == 2
    finally:
        await hub.close()


def _consume_args(engine: AsyncEngine, now: int) -> tuple[list[str], list[Any]]:
    """The keys and arguments of one consume call (what another consumer would send)."""
    op = ops.consume(engine.config, NS, [Q], 30_000, 1, now)
    step = op.send(None)
    assert isinstance(step, Eval)
    return list(step.keys), list(step.args)


async def test_a_consume_cancelled_while_its_reply_is_in_flight_gives_the_job_back(
    engine: AsyncEngine,
) -> None:
    """A long-poll cancelled (its client left, or a multi-pool consume took another pool's
    jobs) after Redis reserved a job but before the reply arrived: the reservation was
    nobody's, and the try was burnt (with one try, the job went to the dead letter)."""
    cfg, t = engine.config, now_ms()
    hub = WaiterHub(engine)
    try:
        (p,) = await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"x", tries=1)], t))
        arrived = asyncio.Event()

        async def slow_reply(step: Step, real: Callable[[Step], Awaitable[Any]]) -> Any:
            reply = await real(step)
            if script_of(step) == "consume":
                arrived.set()
                await asyncio.sleep(0.5)  # the reply is still on its way
            return reply

        inject(engine, slow_reply)
        task = asyncio.create_task(hub.consume(NS, [Q], 30_000, 1, 0))
        await arrived.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        del engine._step
        for _ in range(250):  # the give-back runs in the background, once the reply is in
            job = await engine.run(ops.peek_job(NS, Q, p.job_id))
            if job is not None and job.state is JobState.READY:
                break
            await asyncio.sleep(0.02)
        assert job is not None and job.state is JobState.READY and job.tries_left == 1
    finally:
        await hub.close()


def _fixed_spec(due: int, body: bytes = b"row") -> JobSpec:
    """A pipeline row's job: a server-format id made for its due time, as a rerun makes it."""
    from cluster_dq.pipeline.schedule import derived_id

    return JobSpec(body, 0, 0, job_id=derived_id(NS, Q, due, body, 1), due_ms=due)


async def test_a_pipeline_rerun_while_the_bucket_may_be_open_creates_nothing(
    engine: AsyncEngine,
) -> None:
    """The duplicate check of a fixed server id looked in its wheel bucket only while the
    publisher thought the bucket closed: a rerun after the bucket's open time (the pump had not
    opened it: it holds buckets back while consumers lag) placed the job a second time; and a
    job cancelled in between came back."""
    cfg, t = engine.config, now_ms()
    due = t + 60_000
    spec = _fixed_spec(due)
    (first,) = await engine.run(ops.publish(cfg, NS, Q, [spec], t))
    assert first.state is JobState.DELAYED and not first.duplicate
    later = due - 2_000  # past the bucket's open time, before the job is due
    (again,) = await engine.run(ops.publish(cfg, NS, Q, [spec], later))
    assert again.duplicate
    assert (await engine.run(ops.sizes(cfg, NS, Q))).delayed == 1
    await engine.run(ops.ack(NS, Q, [first.job_id], later + 1, cfg.remember_acked_ms))
    (back,) = await engine.run(ops.publish(cfg, NS, Q, [spec], later + 2))
    assert back.duplicate and (await engine.run(ops.sizes(cfg, NS, Q))).delayed == 0


def test_a_schedule_for_later_counts_the_ttl_from_its_reference_time() -> None:
    """``pipeline schedule --at`` tomorrow: the ttl was validated against the reference time
    but counted from when the partition published, so every job expired before it was due."""
    from cluster_dq.pipeline.rows import check_row
    from cluster_dq.pipeline.schedule import spec_of

    ref = now_ms() + 86_400_000
    row = {"namespace": NS, "queue": Q, "body": "x", "delay_s": 60, "ttl_s": 3600}
    checked = check_row(row, ref)
    assert checked[0], checked
    spec = spec_of(checked, {})
    assert spec.due_ms == ref + 60_000 and spec.expire_at_ms == ref + 3_600_000
    validate_spec(spec)
    bad = check_row({**row, "ttl_s": 60}, ref)  # ends the moment it is due
    assert not bad[0] and "ttl" in bad[9]


async def test_a_schedule_for_later_keeps_its_jobs_until_they_are_due(engine: AsyncEngine) -> None:
    from cluster_dq.pipeline.rows import check_row
    from cluster_dq.pipeline.schedule import spec_of

    cfg, t = engine.config, now_ms()
    ref = t + 30_000
    spec = spec_of(
        check_row({"namespace": NS, "queue": Q, "body": "x", "delay_s": 1, "ttl_s": 5}, ref), {}
    )
    await engine.run(ops.publish(cfg, NS, Q, [spec], t))
    await engine.run(ops.tick(cfg, NS, Q, ref + 1_000))
    (job,) = await engine.run(ops.consume(cfg, NS, [Q], 1_000, 1, ref + 1_000))
    assert job.body == b"x"


async def test_consume_drops_a_bounded_number_of_expired_jobs_per_call(engine: AsyncEngine) -> None:
    """50 k expired jobs ahead of a live one made one consume script run 338 ms; each call
    now drops at most ``promote_limit`` of them, and the consume goes on past them in calls."""
    cfg, t = dataclasses.replace(engine.config, promote_limit=200), now_ms()
    for i in range(0, 1_000, 64):
        specs = [JobSpec(b"old", ttl_ms=1_000) for _ in range(min(64, 1_000 - i))]
        await engine.run(ops.publish(cfg, NS, Q, specs, t))
    (live,) = await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"live", ttl_ms=0)], t + 1))
    dropped: list[int] = []

    async def count_drops(step: Step, real: Callable[[Step], Awaitable[Any]]) -> Any:
        reply = await real(step)
        if script_of(step) == "consume":
            dropped.append(int(reply[4]))
        return reply

    inject(engine, count_drops)
    (job,) = await engine.run(ops.consume(cfg, NS, [Q], 30_000, 1, t + 2_000))
    assert job.job_id == live.job_id
    assert max(dropped) <= 200 and sum(dropped) == 1_000, dropped


async def test_a_multi_queue_consume_stops_visiting_a_queue_once_its_event_is_taken(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """A queue whose marked next event (META.next) has passed is visited by every
    multi-queue consume (a script call on it, the others skipped after one look at all). The
    consume that takes the event's job brings the mark up to the queue's next event, still
    no later than any: the consumes after it visit no queue until then. Before, the mark
    stayed passed until the pump's next step of the queue, and each long-poll look of an
    8-queue consumer cost up to 8 script calls that found nothing."""
    cfg, t = engine.config, now_ms()
    queues = [f"mq{i}" for i in range(4)]
    for q in queues:  # each with a job due much later
        await engine.run(ops.publish(cfg, NS, q, [JobSpec(b"later", delay_ms=60_000)], t))
    await engine.run(ops.publish(cfg, NS, queues[2], [JobSpec(b"soon", delay_ms=100)], t))
    visited: list[str] = []

    async def count(step: Step, real: Callable[[Step], Awaitable[Any]]) -> Any:
        if isinstance(step, Eval) and step.script == "consume":
            visited.append(step.keys[0])
        return await real(step)

    inject(engine, count)
    (job,) = await engine.run(ops.consume(cfg, NS, queues, 30_000, 1, t + 200))
    assert job.queue == queues[2] and len(visited) == 1
    for q in queues:
        check_queue(sync_redis, NS, q)  # the mark is still no later than any event
    marked = int(sync_redis.hget(QueueKeys(NS, queues[2]).meta, "next") or 0)
    assert marked == t + 200 + 30_000  # the reservation's end, now the queue's next event
    visited.clear()
    assert await engine.run(ops.consume(cfg, NS, queues, 30_000, 1, t + 300)) == []
    assert visited == []


async def test_a_long_poll_on_many_queues_is_looked_for_once_per_reason(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-poll on 8 queues, each with a job due at the same moment, which another consumer
    (another instance's) takes first: at that moment the 8 queues' watchers wake, and one
    look for the waiter, begun after it, covers all 8 queues. The others do not repeat it (each
    used to, in turn, 8 looks of 8 queues for one reason)."""
    cfg = engine.config
    queues = [f"lp{i}" for i in range(8)]
    monkeypatch.setattr(waiters, "SAFETY_POLL_S", 10.0)  # no other reason to look meanwhile
    hub = WaiterHub(engine)
    try:
        poll = asyncio.create_task(hub.consume(NS, queues, 30_000, 1, 30_000))
        for _ in range(500):  # every watcher subscribed (it hears the due times)
            if len(hub.notices.channels) == 8:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # and done with its first look
        t = now_ms()
        due = t + 1_000  # time enough, under load, for another consumer to take them first
        for q in queues:
            await engine.run(ops.publish(cfg, NS, q, [JobSpec(b"x", delay_ms=1_000)], t))
        taken = await engine.run(ops.consume(cfg, NS, queues, 30_000, 8, due + 50))
        assert len(taken) == 8  # another consumer's, before they are due here
        looks: list[float] = []

        async def count(step: Step, real: Callable[[Step], Awaitable[Any]]) -> Any:
            if isinstance(step, tuple) and step and step[0].args[0] == "EXISTS":
                looks.append(now_ms() - due)  # a multi-queue consume's first look
            return await real(step)

        inject(engine, count)
        await asyncio.sleep(max(due - now_ms(), 0) / 1000 + 0.5)
        assert not poll.done()  # the jobs were not there for it
        assert len(looks) == 1, looks  # 8 before, one after the other
        poll.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poll
    finally:
        await hub.close()


@pytest.mark.parametrize("queues", [["lone"], ["other", "lone"]], ids=["one-queue", "two-queues"])
async def test_a_long_poll_learns_its_queues_next_event_from_its_own_look(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, queues: list[str]
) -> None:
    """A long-poll waits on a queue whose only job is held by another consumer, until its ttr
    runs out. The look that found nothing (the script, or the multi-queue probe) says when
    that is: the waiter gets the job back at its ttr's end, without a sizes.lua after each
    empty look (one per watcher per look, most of them for nothing) and without the 1-s poll."""
    cfg = engine.config
    monkeypatch.setattr(waiters, "SAFETY_POLL_S", 10.0)  # the due time is the only way on time
    t = now_ms()
    await engine.run(ops.publish(cfg, NS, "lone", [JobSpec(b"x", tries=2)], t))
    reserved = now_ms()
    (held,) = await engine.run(ops.consume(cfg, NS, ["lone"], 600, 1, reserved))
    ends = reserved + 600  # its ttr's end
    calls: list[str | None] = []

    async def count(step: Step, real: Callable[[Step], Awaitable[Any]]) -> Any:
        calls.append(script_of(step))
        return await real(step)

    inject(engine, count)
    hub = WaiterHub(engine)
    try:
        (job,) = await hub.consume(NS, queues, 30_000, 1, 5_000)
        late = now_ms() - ends
        assert job.job_id == held.job_id
        assert 0 <= late < 300, late  # at its ttr's end, not at a safety poll
        assert "sizes" not in calls, calls
    finally:
        await hub.close()


async def test_a_job_put_off_after_the_look_that_covered_a_watcher_sets_its_timer(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watcher whose waiter another look covered reads its queue from that look's record;
    a job put off into its queue after that look began (its ``due:`` notice heard while the
    watcher waited for the waiter to be free) must still set its timer: the record does not
    know of it, and the watcher asks sizes.lua instead (it slept to its safety poll)."""
    monkeypatch.setattr(waiters, "SAFETY_POLL_S", 10.0)
    cfg = engine.config
    hub = WaiterHub(engine)
    watcher = waiters._Watcher(hub, NS, "put-off")  # driven here, not by a task of its own
    looked = engine.clock()
    watcher.reason_ms, watcher.strict = looked - 1, True
    watcher.seen = (looked, 0, None)  # a look begun at ``looked``: the queue empty
    waiter = waiters.Waiter(NS, ["other", "put-off"], 30_000, 1, time.monotonic() + 30)
    waiter.looked_empty = looked
    watcher.waiters.append(waiter)
    await asyncio.sleep(0.01)
    due = now_ms() + 3_000
    await engine.run(ops.publish(cfg, NS, "put-off", [JobSpec(b"x", delay_ms=3_000)], due - 3_000))
    watcher.noticed_due(due)  # its notice, heard before the watcher serves again
    serving = asyncio.create_task(watcher._serve())
    try:
        for _ in range(200):  # until it sleeps (its look at sizes, if any, is done)
            if watcher._timer is not None:
                break
            await asyncio.sleep(0.01)
        assert watcher._timer is not None and watcher._timer_due is not None
        assert abs(watcher._timer_due - due) <= 1, (watcher._timer_due, due)
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await hub.close()


async def test_a_job_made_ready_while_a_watcher_subscribes_is_not_left_waiting(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-poll on two queues; a job becomes ready in the second while its watcher is still
    subscribing (its notice reaches nobody), after the first queue's watcher looked. The
    second watcher's own first look, once subscribed, finds it: no look begun before the
    subscription covers that watcher (one did, and the job waited for the 1-s safety poll)."""
    cfg = engine.config
    hub = WaiterHub(engine)
    real = hub.notices.listen
    subscribing = asyncio.Event()

    async def slowly(channel: bytes) -> None:
        if b"sub-late" in channel:
            subscribing.set()
            await asyncio.sleep(0.3)
        await real(channel)

    monkeypatch.setattr(hub.notices, "listen", slowly)
    try:
        poll = asyncio.create_task(hub.consume(NS, ["sub-early", "sub-late"], 30_000, 1, 5_000))
        await subscribing.wait()
        await asyncio.sleep(0.1)  # the first watcher has looked
        published = time.monotonic()
        await engine.run(ops.publish(cfg, NS, "sub-late", [JobSpec(b"x")], now_ms()))
        (job,) = await poll
        assert job.queue == "sub-late"
        assert time.monotonic() - published < 0.8  # ~0.3 s: its subscription's end
    finally:
        await hub.close()


async def test_a_due_job_with_a_priority_does_not_wait_behind_a_backlog(
    engine: AsyncEngine,
) -> None:
    """A long-delayed high-priority job rested in a wheel bucket; buckets are held back while
    consumers lag, so once due it waited behind every low-priority job already ready."""
    cfg, t = dataclasses.replace(engine.config, open_backlog=50), now_ms()
    (urgent,) = await engine.run(
        ops.publish(cfg, NS, Q, [JobSpec(b"urgent", delay_ms=60_000, priority=9)], t)
    )
    for _ in range(2):
        await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"bulk") for _ in range(40)], t + 1))
    later = t + 61_000
    await engine.run(ops.tick(cfg, NS, Q, later))
    (job,) = await engine.run(ops.consume(cfg, NS, [Q], 30_000, 1, later))
    assert job.job_id == urgent.job_id


async def test_the_registry_forgets_a_queue_that_is_empty_and_idle(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """The shard registry kept every queue ever seen, so the pump's size pass and /info grew
    without bound."""
    from cluster_dq.keys import ShardKeys, shard_of
    from cluster_dq.pump import Pump

    cfg, clock = engine.config, Clock(now_ms())
    engine.clock = clock
    (p,) = await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"x", ttl_ms=5_000)], clock()))
    shard = shard_of(f"{NS}/{Q}", cfg.shards)
    registry = ShardKeys(shard).queues
    assert sync_redis.sismember(registry, f"{NS}/{Q}")
    pump = Pump(engine, [shard])
    assert await pump._renew(shard)
    await engine.run(ops.ack(NS, Q, [p.job_id], clock()))
    clock.t += 6_000  # the queue's last scheduled event (the ttl) comes; it is empty now
    await pump.pump_shard(shard)
    assert not sync_redis.sismember(registry, f"{NS}/{Q}")
    (again,) = await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"y")], clock()))
    assert sync_redis.sismember(registry, f"{NS}/{Q}")  # registered again by its next publish
    await engine.run(ops.lead(shard, pump.token, 1, give_up=True))


async def test_release_and_respawn_never_write_half_a_job(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """With an invariant already broken (a reserved or dead member whose record is missing),
    release and respawn raised in the middle of their script: Redis keeps what a script wrote
    before an error, so each left a partial write behind (and failed every later call)."""
    from cluster_dq.keys import QueueKeys

    cfg, t = engine.config, now_ms()
    k = QueueKeys(NS, Q)
    (p,) = await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"x", tries=2)], t))
    (job,) = await engine.run(ops.consume(cfg, NS, [Q], 30_000, 1, t))
    sync_redis.hdel(k.jobs, _member(job.job_id))
    assert await engine.run(
        ops.release(cfg, NS, Q, [job.job_id], 0, t + 1, leases=[job.lease])
    ) == [None]
    sync_redis.zadd(k.dead, {b"ghost": t})
    (q,) = await engine.run(ops.publish(cfg, NS, Q, [JobSpec(b"y")], t))
    sync_redis.zadd(k.dead, {_member(q.job_id): t})  # a real one beside the ghost
    sync_redis.zrem(k.ready, _member(q.job_id))
    assert await engine.run(ops.respawn(cfg, NS, Q, 10, 0, t + 2)) == 1
    assert (
        sync_redis.zcard(k.dead) == 0 and sync_redis.zscore(k.ready, _member(q.job_id)) is not None
    )
    assert not sync_redis.hexists(k.jobs, b"ghost")


def _member(job_id: str) -> bytes:
    from cluster_dq.models import id_to_member

    return id_to_member(job_id)


async def test_a_pump_task_cancelled_while_redis_py_turns_it_into_a_connection_error_ends(
    engine: AsyncEngine,
) -> None:
    """redis-py may turn a cancellation inside a command into a ConnectionError. The pump's
    lease renewal took that for a failed renewal and went on: the task, cancelled once, ran
    forever (a killed leader's pump never ended; found by a schedule test under load)."""
    in_flight = asyncio.Event()

    async def cancel_becomes_connection_error(
        step: Step, real: Callable[[Step], Awaitable[Any]]
    ) -> Any:
        if script_of(step) == "leader":
            in_flight.set()
            try:
                await asyncio.sleep(0.5)  # the renewal's reply is on its way
            except asyncio.CancelledError:
                raise RedisConnectionError("Connection closed by server.") from None
        return await real(step)

    inject(engine, cancel_becomes_connection_error)
    await _cancelled_in_flight_ends(engine, in_flight)


async def test_a_pump_whose_cancellation_redis_py_swallows_still_ends(
    engine: AsyncEngine,
) -> None:
    """redis-py may also absorb a cancellation inside a command and return its reply as if
    nothing happened: the loop, its task marked as cancelling, must still end at its top."""
    in_flight = asyncio.Event()

    async def swallow(step: Step, real: Callable[[Step], Awaitable[Any]]) -> Any:
        reply = await real(step)
        if script_of(step) == "claim":
            in_flight.set()
            with contextlib.suppress(asyncio.CancelledError):  # swallowed: a normal reply
                await asyncio.sleep(0.5)
        return reply

    inject(engine, swallow)
    await _cancelled_in_flight_ends(engine, in_flight)


async def _cancelled_in_flight_ends(engine: AsyncEngine, in_flight: asyncio.Event) -> None:
    """A pump of shard 0 on ``engine`` (its fault injected), its tasks cancelled once the
    fault's step is in flight: every task ends, as cancelled."""
    pump = Pump(engine, [0], lease_ms=900, poll_ms=100, reconcile_every_s=0)
    pump.start()
    try:
        await asyncio.wait_for(in_flight.wait(), 5)
        for task in pump._tasks:
            task.cancel()
        _, going_on = await asyncio.wait(pump._tasks, timeout=5)
        assert not going_on, "a pump task cancelled 5 s ago is still running"
        assert all(task.cancelled() for task in pump._tasks)
    finally:
        await pump.stop()
        del engine._step


@pytest.mark.parametrize("outage", ["killed", "stalled"])
async def test_a_pump_stopped_while_redis_is_down_stops_at_once(
    outage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopping gave up each lease it still counted as held, one after the other, each with
    the ~5 s budget of a write: during an outage a SIGTERM waited 5 s per shard (16 s in a
    test, a minute and more with every shard led). A give-up only shortens the next leader's
    wait, so it is tried once for all shards together, for GIVE_UP_S at most, never past the
    lease itself. A stalled Redis (SIGSTOP: a paused VM) answers nothing: the attempt itself
    is cut at GIVE_UP_S (it waited for the 5-s socket timeout)."""
    from cluster_dq import pump as pump_module
    from cluster_dq.engine.commands import EngineConfig
    from cluster_dq.localredis import start_server
    from cluster_dq.pools import close_client, make_client

    monkeypatch.setattr(pump_module, "GIVE_UP_S", 0.3)
    server = start_server()
    client = make_client(server.pool_settings())
    engine = AsyncEngine(client, EngineConfig())
    pump = Pump(engine, lease_ms=20_000, poll_ms=100, reconcile_every_s=0)
    try:
        for shard in pump.shards:
            assert await pump._renew(shard)
        pump.start()
        if outage == "killed":
            server.kill()
        else:
            server.process.send_signal(signal.SIGSTOP)
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(pump.stop(), 30)
        took = asyncio.get_running_loop().time() - started
        # 0.3 s and the cancellations: 3 s is a bound on a loaded machine, not a figure
        assert took < 3, f"stopping took {took:.1f} s with {len(pump.shards)} shards led"
    finally:
        with contextlib.suppress(ProcessLookupError):
            server.process.send_signal(signal.SIGCONT)
        server.stop()
        await close_client(client)


async def test_a_publish_call_repeated_after_its_reply_was_lost_writes_each_wheel_job_once(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """A wheel job whose id the call made up is written with HSET (one look through its bucket,
    not HSETNX's two): the same call run again, as after a lost reply, must still write nothing
    new, change no record, and answer each job as present, for ids made up and ids given."""
    from cluster_dq.engine import replies
    from cluster_dq.pipeline.schedule import derived_id

    cfg, t = engine.config, now_ms()
    due = t + 120_000
    specs = [JobSpec(b"made-up %d" % i, delay_ms=120_000) for i in range(6)]
    specs += [JobSpec(b"given", job_id=derived_id(NS, Q, due, b"given", 1), due_ms=due)]
    call, placed = publish_call(cfg, QueueKeys(NS, Q), specs, t)

    def twice() -> Any:
        first = yield call
        before = {b: sync_redis.hgetall(b) for b in call.keys if ":w:" in b}
        again = yield call.restamped(t + 5)
        return first, before, again

    first, before, again = await engine.run(twice())
    codes = replies.decode_publish(first, len(specs)).codes
    assert set(codes) == {replies.ReplyCode.WHEEL}
    assert set(replies.decode_publish(again, len(specs)).codes) == {replies.ReplyCode.DUPLICATE}
    assert {b: sync_redis.hgetall(b) for b in before} == before
    assert sum(len(v) for v in before.values()) == len(specs)
    assert check_queue(sync_redis, NS, Q)["wheel"] == len(specs)  # META.w counted each once
